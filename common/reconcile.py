"""One answer to "what is left": the ledger and RQ's lists read together, the same way by every tool.

The ledger (:mod:`common.ledger`) says which items are done; RQ's lists are only transport. A
job of a queue is in exactly one of these places, and this module is the one reader of them:

- **queued**: its id is on the queue's list;
- **starting**: a worker moved it to RQ's intermediate list (``BLMOVE``) and has not registered
  its execution yet; normal for a moment, *lost* once that worker is gone;
- **running**: an execution in the started registry whose heartbeat holds;
- **retrying**: waiting in the scheduled (retry backoff) or deferred registry;
- **lost**: in no runnable place: an execution whose worker stopped heartbeating, an id left
  in the intermediate list for a whole heartbeat TTL or with no live worker that could hold it.
  Any worker re-queues lost jobs (:mod:`worker.serving.recovery`), at start and from its keeper;
  until then they are work left, never done.

Beside the jobs, the campaign's enqueues in progress (:mod:`common.enqueues`): one still reading
its file will queue more; one that stopped mid-file must be run again.

**Complete** has one definition, :attr:`Left.complete`, which ``status``, ``wait``, ``verify``,
the metrics and burst workers share: no job pending, no enqueue open (reading or stopped
mid-file), and every image of the campaign written. A job that failed or was cancelled and
whose items were made later (retried, enqueued again, or finished by a worker that came back)
is no missing image; one whose items were never made is.

Items are queued, running, done, failed or lost by their job's place (:func:`item_states`):
an item whose job is gone, stopped or cancelled without its images is lost too, and
``producer enqueue`` of its file queues it again.

``producer status``, ``producer wait``, ``producer verify``, a burst worker deciding whether the
queue is drained, and the metrics all ask :func:`left`; none counts on its own. A tool that did
would, after some fault, say done while an image is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import DeferredJobRegistry, FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import parse_composite_key

from common.enqueues import EnqueueRun, enqueues_key, runs_of
from common.heartbeats import beating, seen_workers
from common.lanes import campaign_of, is_group_lane, lanes
from common.queues import enqueued_key, images_key
from common.rq_keys import rq_names


def intermediate_key(queue: str) -> str:
    """RQ's list of jobs a worker took (``BLMOVE``) and has not started yet."""
    return IntermediateQueue.get_intermediate_queue_key(Queue.redis_queue_namespace_prefix + queue)


def intermediate_seen_key(queue: str) -> str:
    """Job id → when a keeper first saw it in the intermediate list (shared by every worker)."""
    return f"diffq:{queue}:intermediate-seen"


@dataclass
class Left:
    """Jobs of one queue by place (see the module docstring), and the images not yet written."""

    queued: int = 0
    starting: int = 0
    running: int = 0
    retrying: int = 0
    lost: int = 0
    #: the lost jobs' ids (intermediate and expired executions), for the tools that list them
    lost_ids: list[str] = field(default_factory=list)
    images_enqueued: int = 0
    images_written: int = 0
    #: of ``queued``, the jobs in the group lane: only a group takes them
    for_groups: int = 0
    #: the campaign's enqueues still reading their file (they will queue more)
    enqueuing: list[EnqueueRun] = field(default_factory=list)
    #: enqueues that stopped mid-file (died, paused, interrupted): run again, they queue the rest
    enqueues_stopped: list[EnqueueRun] = field(default_factory=list)

    @property
    def pending(self) -> int:
        """Jobs that are not over: while this is not 0, the campaign is not done."""
        return self.queued + self.starting + self.running + self.retrying + self.lost

    @property
    def settled(self) -> bool:
        """Nothing will change by itself any more: no job pending, no enqueue reading its file."""
        return not self.pending and not self.enqueuing

    @property
    def images_missing(self) -> int:
        """Images of the campaign not written (never below 0)."""
        return max(0, self.images_enqueued - self.images_written)

    @property
    def complete(self) -> bool:
        """Every image of the campaign is written and nothing is left to queue or run (the one
        definition: see the module docstring)."""
        return is_complete(self.pending, len(self.enqueuing), len(self.enqueues_stopped), self.images_missing)


def is_complete(pending: int, enqueuing: int, enqueues_stopped: int, images_missing: int) -> bool:
    """The one definition of a complete campaign (module docstring), for every tool that says it."""
    return not pending and not enqueuing and not enqueues_stopped and not images_missing


def live_workers(conn: redis.Redis, queue: str, ttl: float, now: float | None = None) -> set[str]:
    """Names of the workers of ``queue`` heard from in the last ``ttl`` seconds (a killed
    worker's key lingers until its own TTL; its last heartbeat tells)."""
    return {worker.name for worker in seen_workers(conn, queue) if beating(worker, ttl, now)}


def left(
    conn: redis.Redis,
    queue: str,
    *,
    ttl: float,
    now: float | None = None,
    me: str | None = None,
    lane: str | None = None,
) -> Left:
    """Where every job of the campaign ``queue`` is now, in both its lanes (:mod:`common.lanes`).
    O(1) in the queue's length: list and set sizes, plus the intermediate lists (at most one
    entry per worker) and the expired executions.

    ``ttl`` is the heartbeat TTL. ``me``: the asking worker, which holds nothing in the
    intermediate list at this moment (between jobs): if no other worker of a lane is alive,
    everything in that lane's list is lost now rather than after a TTL. ``lane``: that lane's
    jobs only (a worker deciding whether the lanes it serves are drained); the image counters
    are the campaign's either way."""
    now = time.time() if now is None else now
    campaign = campaign_of(queue)
    read = lanes(campaign) if lane is None else (lane,)
    state = Left()
    with conn.pipeline(transaction=False) as pipe:
        for name in read:
            started = StartedJobRegistry(name, connection=conn).key
            pipe.llen(Queue(name, connection=conn).key)
            pipe.zcount(started, f"({now}", "+inf")
            pipe.zrangebyscore(started, "-inf", now)
            pipe.zcard(ScheduledJobRegistry(name, connection=conn).key)
            pipe.zcard(DeferredJobRegistry(name, connection=conn).key)
            pipe.lrange(intermediate_key(name), 0, -1)
            pipe.hgetall(intermediate_seen_key(name))
        pipe.get(enqueued_key(campaign))
        pipe.get(images_key(campaign))
        pipe.hgetall(enqueues_key(campaign))
        answers = pipe.execute()
    enqueued, written, enqueues = answers[-3:]
    state.images_enqueued, state.images_written = int(enqueued or 0), int(written or 0)
    for run in runs_of(enqueues):
        (state.enqueuing if run.alive(ttl, now) else state.enqueues_stopped).append(run)
    for at, name in zip(range(0, len(answers) - 3, 7), read, strict=True):
        queued, running, expired, scheduled, deferred, taken, seen = answers[at : at + 7]
        state.queued += queued
        state.running += running
        state.retrying += scheduled + deferred
        if is_group_lane(name):
            state.for_groups = queued
        state.lost_ids += [parse_composite_key(raw.decode())[0] for raw in expired]
        if taken:
            nobody = not (live_workers(conn, name, ttl, now) - {me})
            for raw in dict.fromkeys(taken):
                first = seen.get(raw)
                if nobody or (first is not None and now - float(first) >= ttl):
                    state.lost_ids.append(raw.decode())
                else:
                    state.starting += 1
    state.lost = len(state.lost_ids)
    return state


def spec_images(job: Job) -> int:
    """Images a diffq job makes, from its spec (0 for anything else)."""
    try:
        return sum(int(item.get("num_images", 1)) for item in job.kwargs["spec"]["items"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return 0


def failed_images(conn: redis.Redis, queue: str, most: int = 10_000) -> int:
    """Images of the jobs in the campaign's failed registries (failed, or stopped on request),
    from their specs: with :class:`Left`'s counters, what no job will write unless it is retried."""
    registries = [FailedJobRegistry(lane, connection=conn) for lane in lanes(queue)]
    ids = [i for registry in registries for i in registry.get_job_ids(0, most - 1, cleanup=False)]  # read-only
    jobs = Job.fetch_many(ids, connection=conn, serializer=JSONSerializer)
    return sum(spec_images(job) for job in jobs if job is not None)


def job_places(conn: redis.Redis, job_ids: Iterable[str], lost: set[str]) -> dict[str, str]:
    """Each job's place for its items: ``live`` (queued, starting, running or retrying),
    ``failed``, or ``lost`` (gone, stopped, cancelled, finished without them, or in ``lost``)."""
    ids = list(dict.fromkeys(job_ids))
    with conn.pipeline(transaction=False) as pipe:
        for jid in ids:
            pipe.hget(Job.key_for(jid), "status")
        statuses = pipe.execute()
    places = {}
    for jid, raw in zip(ids, statuses, strict=True):
        status = raw.decode() if raw else None
        if status is not None and status not in rq_names().ended and jid not in lost:
            places[jid] = "live"
        elif status == JobStatus.FAILED.value:
            places[jid] = "failed"
        else:
            places[jid] = "lost"
    return places
