"""The items ledger: which rows are queued, done and recorded, and the atomic steps that change it.

``diffq:<queue>:items`` is a hash from item key to the item's state:

- ``<job id>``: queued or running in that job; its metadata lines are not recorded yet.
- ``r:<job id>``: done once, queued again because its images went missing on disk while its
  metadata lines stayed. The lines are not written again; the images are counted again when
  they are written (CLAIM took them off the count: a count is never ahead of the disk).
- ``done:<output id>``: its images are written in that output (:func:`common.naming.output_id`),
  its metadata lines recorded, and it is counted in ``diffq:<queue>:images``. A plain ``done``
  (written before outputs were named) means the same for an output not known.

A done item whose images *and* lines are gone is queued again as a plain ``<job id>``, off the
count too: it is made, recorded and counted as if new.

Every change of state is one Lua script, so it is atomic with the check that allows it:

- :data:`CLAIM` (producer): a chunk's items become its job and the job is pushed on the queue,
  only if no item is queued or running in a live job already. Two producers that enqueue the
  same file at once cannot both queue an item: the second one's script sees the first one's job.
- :data:`BEGIN` and :data:`COMMIT` (worker): recording a job's images happens only while this
  worker's execution of the job is still in RQ's started registry. A worker whose heartbeat
  expired (stalled, partitioned) and whose job was given to another records nothing.

``diffq:<queue>:intents`` maps an item key to the byte offset of ``metadata.jsonl`` at which a
worker was about to append its lines. It is set by BEGIN (before the append) and cleared by
COMMIT; a later execution that finds it knows that lines for the item may be there already,
and reads the file from that offset instead of writing them twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from common.lanes import MADE_BY_WORKER, campaign_of, lanes, made_by_key
from common.naming import output_id
from common.queues import RECENT_WINDOW_S, by_model_key, enqueued_key, images_key, intents_key, items_key, recent_key
from common.rq_keys import canceled_registry_key, failed_registry_key, queue_key, rq_names, started_registry_key

DONE = "done"


def is_done(state: bytes | str | None) -> bool:
    """``done`` or ``done:<output id>``: the item's images and lines are written."""
    if isinstance(state, bytes):
        return state.startswith(b"done")
    return bool(state) and state.startswith(DONE)  # type: ignore[union-attr]


def done_in(state: bytes | str | None) -> str | None:
    """The output id a done state names (None: a plain ``done``, or not done)."""
    text = state.decode() if isinstance(state, bytes) else state
    return text[len(DONE) + 1 :] if text and text.startswith(DONE + ":") else None


REDO_PREFIX = "r:"
#: CLAIM's redo flags: make an item that is not done; remake a done item's images (its lines are
#: there); remake a done item's images and lines
MAKE, REMAKE_IMAGES, REMAKE_ALL = 0, 1, 2

#: KEYS: items, queue (the lane the job goes to), job hash, rq:queues, images-enqueued counter,
#: images-written counter, images by model, then the failed and canceled registries of both of
#: the campaign's lanes (a job queued again under its old id leaves them, whichever lane it was in).
#: ARGV: job id, n, RQ's job key prefix, RQ's ended statuses (comma-separated; see
#: :mod:`common.rq_keys`), the job's model, n item keys, n redo flags, n image counts, job fields... A redo flag
#: is '0' (make it if it is not done), '1' (done, its images are missing, its lines are there)
#: or '2' (done, its images and lines are missing). An item whose job has any status but an
#: ended one (statuses RQ adds later included) is taken.
#: Returns {} when the job was queued, else the item keys that are taken (or '*job' when a live
#: job with this id exists). The ``#!lua`` line declares it a script with flags (Redis 7), and
#: without ``allow-oom`` Redis refuses it whole when it is over ``maxmemory``: no chunk is ever
#: half queued (an unflagged script that has written once may go on writing past the limit).
CLAIM = """#!lua
local n = tonumber(ARGV[2])
local prefix = ARGV[3]
local ended = {}
for status in string.gmatch(ARGV[4], '[^,]+') do ended[status] = true end
local model = ARGV[5]
local first = 5
local taken = {}
for i = 1, n do
  local key = ARGV[first + i]
  local state = redis.call('HGET', KEYS[1], key)
  local free = false
  if not state then
    free = true
  elseif string.sub(state, 1, 4) == 'done' then
    free = ARGV[first + n + i] ~= '0'
  else
    local owner = state
    if string.sub(owner, 1, 2) == 'r:' then owner = string.sub(owner, 3) end
    local status = redis.call('HGET', prefix .. owner, 'status')
    free = (not status) or ended[status] == true
  end
  if not free then table.insert(taken, key) end
end
if #taken > 0 then return taken end
local status = redis.call('HGET', KEYS[3], 'status')
if status and not ended[status] then return {'*job'} end
redis.call('DEL', KEYS[3])
for k = 8, #KEYS do redis.call('ZREM', KEYS[k], ARGV[1]) end
local images = 0
local uncounted = 0
for i = 1, n do
  local key = ARGV[first + i]
  local flag = ARGV[first + n + i]
  local count = tonumber(ARGV[first + 2 * n + i])
  local state = redis.call('HGET', KEYS[1], key)
  local value = ARGV[1]
  if state and string.sub(state, 1, 4) == 'done' then
    uncounted = uncounted + count
    if flag == '1' then value = 'r:' .. ARGV[1] end
  elseif state and string.sub(state, 1, 2) == 'r:' then
    if flag ~= '2' then value = 'r:' .. ARGV[1] end
  elseif not state then
    images = images + count
  end
  redis.call('HSET', KEYS[1], key, value)
end
if images > 0 then
  redis.call('INCRBY', KEYS[5], images)
  redis.call('HINCRBY', KEYS[7], model .. ':enqueued', images)
end
if uncounted > 0 then
  redis.call('DECRBY', KEYS[6], uncounted)
  redis.call('HINCRBY', KEYS[7], model .. ':written', -uncounted)
end
redis.call('HSET', KEYS[3], unpack(ARGV, first + 1 + 3 * n))
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[4], KEYS[2])
return {}
"""

#: KEYS: started registry, items, intents. ARGV: execution member, offset, item keys...
#: Returns -1 if the execution is no longer this worker's, else per item {state, earlier intent}.
BEGIN = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
local out = {}
for i = 3, #ARGV do
  local key = ARGV[i]
  local state = redis.call('HGET', KEYS[2], key) or ''
  local intent = redis.call('HGET', KEYS[3], key) or ''
  if string.sub(state, 1, 4) ~= 'done' and intent == '' then redis.call('HSET', KEYS[3], key, ARGV[2]) end
  table.insert(out, {state, intent})
end
return out
"""

#: KEYS: started registry, items, intents, images counter, recent, made-by, images by model.
#: ARGV: execution member, now, window start, recent member, the done state (``done:<output
#: id>``), who made them (``worker`` or ``group``), the job's model, then (item key, images)
#: pairs. Returns -1 if the execution is no longer this worker's, else the number of images
#: newly counted.
COMMIT = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
local counted = 0
for i = 8, #ARGV, 2 do
  local key = ARGV[i]
  local state = redis.call('HGET', KEYS[2], key)
  if not state or string.sub(state, 1, 4) ~= 'done' then
    counted = counted + tonumber(ARGV[i + 1])
    redis.call('HSET', KEYS[2], key, ARGV[5])
  end
  redis.call('HDEL', KEYS[3], key)
end
if counted > 0 then
  redis.call('INCRBY', KEYS[4], counted)
  redis.call('HINCRBY', KEYS[6], ARGV[6], counted)
  redis.call('HINCRBY', KEYS[7], ARGV[7] .. ':written', counted)
end
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[3])
return counted
"""


@dataclass(frozen=True)
class Begun:
    """What BEGIN found for one item: its ledger state and an earlier execution's intent offset."""

    state: str
    intent: int | None

    @property
    def recorded(self) -> bool:
        """Its metadata lines are in the file already (done, or done once and being remade)."""
        return is_done(self.state) or self.state.startswith(REDO_PREFIX)


class Ledger:
    """One campaign's ledger: the three scripts, registered once per connection, and every key
    they touch, diffq's (``diffq:<queue>:*``) and RQ's (named by rq, :mod:`common.rq_keys`).
    Callers pass what changes, never a key name.

    ``lane`` is the RQ queue the job is in or goes to (the campaign's own, or its group lane,
    :mod:`common.lanes`); the ledger's keys are the campaign's either way."""

    def __init__(self, conn: redis.Redis, lane: str) -> None:
        queue = campaign_of(lane)
        self.conn = conn
        self.queue = queue
        self.lane = lane
        self.items_key = items_key(queue)
        self.intents_key = intents_key(queue)
        self.images_key = images_key(queue)
        self.enqueued_key = enqueued_key(queue)
        self.recent_key = recent_key(queue)
        self.made_by_key = made_by_key(queue)
        self.by_model_key = by_model_key(queue)
        self.started_key = started_registry_key(lane)
        self._claim = conn.register_script(CLAIM)
        self._begin = conn.register_script(BEGIN)
        self._commit = conn.register_script(COMMIT)

    def claim(
        self,
        *,
        job_id: str,
        model: str,
        keys: list[str],
        redo: list[int],
        images: list[int],
        job_fields: list[bytes | str],
        client: redis.client.Pipeline | None = None,
    ) -> Any:
        """Queue the job if all its items are free. Answers the item keys that were taken instead
        (empty: queued); with a pipeline as ``client``, the answer comes from its ``execute``.
        ``redo`` per item: :data:`MAKE`, :data:`REMAKE_IMAGES` or :data:`REMAKE_ALL`."""
        rq = rq_names()
        args: list[bytes | str | int] = [
            job_id,
            len(keys),
            rq.job_prefix,
            rq.ended_arg(),
            model,
            *keys,
            *map(str, redo),
            *images,
            *job_fields,
        ]
        keys_ = [
            self.items_key,
            queue_key(self.lane),
            rq.job_prefix + job_id,
            rq.queues_key,
            self.enqueued_key,
            self.images_key,
            self.by_model_key,
            *(key for lane in lanes(self.queue) for key in (failed_registry_key(lane), canceled_registry_key(lane))),
        ]
        return self._claim(keys=keys_, args=args, client=client)

    def begin(self, *, member: str, offset: int, keys: list[str]) -> list[Begun] | None:
        """Check ownership and note the append offset; None if this execution lost the job."""
        out = self._begin(keys=[self.started_key, self.items_key, self.intents_key], args=[member, offset, *keys])
        if out == -1:
            return None
        return [Begun(state.decode(), int(intent) if intent else None) for state, intent in out]

    def commit(
        self,
        *,
        member: str,
        images: dict[str, int],
        recent_member: str,
        output: str,
        model: str,
        made_by: str = MADE_BY_WORKER,
        now: float | None = None,
    ) -> int | None:
        """Mark the items done in ``output`` and count their images (also under ``made_by``, a
        single worker or a group); None if this execution lost the job. ``recent_member`` goes
        into the window of recent jobs that status computes rates from."""
        now = time.time() if now is None else now
        pairs = [v for key, count in images.items() for v in (key, count)]
        done = f"{DONE}:{output_id(output)}"
        out = self._commit(
            keys=[
                self.started_key,
                self.items_key,
                self.intents_key,
                self.images_key,
                self.recent_key,
                self.made_by_key,
                self.by_model_key,
            ],
            args=[member, now, now - RECENT_WINDOW_S, recent_member, done, made_by, model, *pairs],
        )
        return None if out == -1 else int(out)
