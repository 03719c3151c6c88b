"""Redis connection, the RQ queue, and the few keys diffq keeps beside RQ's own.

RQ's registries (queued, started, finished, failed, scheduled) are the source of truth for
job state. A campaign has two RQ queues, ``<queue>`` and its group lane ``<queue>:group``
(:mod:`common.lanes`); the keys below are the campaign's, whichever lane names them. Beside
RQ's lists we keep only what RQ cannot tell us:

- ``diffq:<queue>:items`` — the ledger (:mod:`common.ledger`): item key → job id while queued,
  ``done`` once its images are written and recorded. This is what makes a re-run of the
  producer add nothing that is queued or done, even after RQ has expired the finished job.
- ``diffq:<queue>:intents`` — item key → offset of ``metadata.jsonl`` where a worker was about
  to append its lines (see :mod:`common.ledger`).
- ``diffq:<queue>:images`` — counter of images recorded; equals the PNGs on disk.
- ``diffq:<queue>:enqueued`` — counter of images ever queued (new items only): the campaign's size.
- ``diffq:<queue>:paused`` — worker name → why it stopped taking jobs (disk full, ...).
- ``diffq:<queue>:made-by`` — images recorded by who made them: single workers, groups.
- ``diffq:<queue>:recent`` — sorted set of recent completions (score: time; member
  ``<job id>:<images>:<seconds the job ran>``) for throughput.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from common.lanes import campaign_of, lanes
from common.rq_keys import finished_registry_key, rq_names
from common.settings import redact

TASK_FUNC = "worker.task.run_job"
RECENT_WINDOW_S = 600


log = logging.getLogger("diffq.redis")

#: how long a command keeps retrying while Redis is unreachable, by who is asking: workers and
#: ``producer wait`` ride out a restart however long it takes; a one-shot command gives up
#: after about a minute with a clear line
PATIENCE_FOREVER = -1
PATIENCE_COMMAND = 20


class WayOut:
    """How long this process still retries Redis: forever while it serves, a few seconds once
    it has been told to stop. One per process, shared by every client :func:`connect` made
    (redis-py deep-copies a client's retry policy into each connection; this object is not
    copied), so a stop bounds every call in every thread at once: the job's progress save,
    the keeper, the writer, RQ's own bookkeeping on the way out.

    Stopping wins over Redis: a worker told to stop while Redis is down must not sit in a
    retry loop for hours. What it could not tell Redis comes back the way a SIGKILLed
    worker's work does, by the heartbeat lapsing."""

    def __init__(self) -> None:
        self._until: float | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> WayOut:
        return self

    def give_up_after(self, seconds: float) -> None:
        """From now on, a Redis call that fails later than ``seconds`` from now raises instead
        of retrying (an earlier deadline is kept)."""
        until = time.monotonic() + seconds
        self._until = until if self._until is None else min(self._until, until)

    def closed(self) -> bool:
        return self._until is not None and time.monotonic() >= self._until


#: the process's one :class:`WayOut` (see there)
WAY_OUT = WayOut()
#: after the first signal, Redis has this long to answer before the worker gives up on it and exits
WARM_STOP_REDIS_S = 15.0


class LoggedRetry(Retry):
    """redis-py's retry with exponential backoff (0.2 s doubling, capped at 5 s), saying so in
    the log (a worker waiting for Redis should look like it is waiting, not hung), and giving
    up once the process is on its way out (:data:`WAY_OUT`)."""

    def __init__(self, *args: Any, way_out: WayOut = WAY_OUT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.way_out = way_out

    def call_with_retry(self, do: Callable[[], Any], fail: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def noisy(error: Exception, *rest: Any) -> Any:
            if self.way_out.closed():
                fail(error, *rest)
                raise error
            log.warning("Redis unreachable (%s: %s); retrying with backoff", error.__class__.__name__, error)
            return fail(error, *rest)

        return super().call_with_retry(do, noisy, *args, **kwargs)


def connect(url: str, *, check: bool = True, retries: int = PATIENCE_COMMAND) -> redis.Redis:
    """A client for ``url`` (redis://, rediss:// or unix://); credentials come from the URL only.

    Every command retries connection errors with backoff (``retries`` times, or forever when
    negative), so a Redis restart is a pause, not a crash. That is safe because everything
    diffq writes is idempotent: item keys and job ids are content hashes, and a job that runs
    twice skips the images it finds done. The first ``PING`` does not retry, so a wrong URL is
    reported at once.
    """
    try:
        probe = redis.Redis.from_url(url, socket_connect_timeout=5, retry=Retry(ExponentialWithJitterBackoff(), 0))
        conn = redis.Redis.from_url(
            url,
            socket_connect_timeout=5,
            socket_keepalive=True,
            health_check_interval=30,
            retry=LoggedRetry(ExponentialWithJitterBackoff(cap=5, base=0.2), retries),
        )
    except ValueError as exc:
        raise ConfigError(f"--redis-url {redact(url)!r}: {exc}") from None
    if check:
        try:
            probe.ping()
        except redis.AuthenticationError:
            if urlsplit(url).password is None:
                raise ConfigError(
                    f"Redis at {redact(url)} needs a password: put it in the URL, "
                    "redis://[user]:PASSWORD@host:port/db (--redis-url or REDIS_URL)"
                ) from None
            raise ConfigError(f"Redis at {redact(url)} refused the credentials in the URL") from None
        except redis.RedisError as exc:
            raise ConfigError(
                refusal(exc, url)
                or f"cannot reach Redis at {redact(url)} ({exc.__class__.__name__}): "
                "start redis-server or set --redis-url / REDIS_URL"
            ) from None
        finally:
            probe.close()
    return conn


def refusal(exc: BaseException, url: str | None = None) -> str | None:
    """One line for a Redis that answers and refuses (a connection limit, a read-only replica,
    no memory left, credentials), or None for one that does not answer. redis-py raises some of
    these as connection errors, which read as "Redis is down" when it is up and saying no."""
    where = f"Redis at {redact(url)}" if url else "Redis"
    text = str(exc)
    if "max number of clients reached" in text:
        return (
            f"{where} is up and refuses new connections: max number of clients reached (its maxclients). "
            "Close idle clients, or raise it: redis-cli CONFIG SET maxclients 20000"
        )
    if isinstance(exc, redis.ReadOnlyError) or text.startswith(("READONLY", "You can't write against a read only")):
        return f"{where} is a read-only replica: point --redis-url / REDIS_URL at its primary"
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or text.startswith("OOM"):
        return (
            f"{where} is out of memory (its maxmemory) and refuses writes: give it more memory or let the "
            "workers drain the queue, then run the same command again"
        )
    if isinstance(exc, redis.AuthenticationError) or text.startswith(("NOAUTH", "WRONGPASS", "invalid password")):
        return f"{where} refused the credentials: check the password in --redis-url / REDIS_URL"
    return None


class LeanJob(Job):
    """A job saved without RQ's empty placeholder fields (``started_at: ''``, ``worker_name: ''``
    and six more). In Redis's hashtable encoding each costs about 60 bytes, a quarter of
    a queued job's memory; RQ reads a missing field exactly as an empty one. Used only to
    create jobs: once a worker saves a job, RQ's ordinary ``Job`` writes every field again,
    so no stale value can hide behind a dropped one."""

    def to_dict(self, include_meta: bool = True, include_result: bool = True) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict(include_meta, include_result).items() if v != ""}


def get_queue(name: str, conn: redis.Redis, *, lean: bool = False, queue_class: type[Queue] = Queue) -> Queue:
    """The RQ queue ``name``, always with the JSON serializer: a job payload can never be pickle.
    ``lean`` for the producer: jobs are created as :class:`LeanJob`. ``queue_class``: a worker of
    several lanes takes them with :class:`common.lanes.LaneQueue`."""
    return queue_class(name, connection=conn, serializer=JSONSerializer, job_class=LeanJob if lean else Job)


def queued_jobs(conn: redis.Redis, queue: str) -> int:
    """Jobs queued in both of the campaign's lanes (:mod:`common.lanes`), in one round trip."""
    with conn.pipeline(transaction=False) as pipe:
        for lane in lanes(queue):
            pipe.llen(Queue.redis_queue_namespace_prefix + lane)
        return sum(pipe.execute())


def items_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:items"


def images_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:images"


def recent_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:recent"


def intents_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:intents"


def paused_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:paused"


def scores_key(queue: str) -> str:
    """The reward scores recorded so far, per scorer: ``<name>:n``, ``:sum`` and ``:sumsq``
    (``producer status`` shows their mean and spread)."""
    return f"diffq:{campaign_of(queue)}:scores"


def load_failures_key(queue: str) -> str:
    """Each model's last failed load by a worker of the campaign: ``model -> {worker, reason,
    at}`` (JSON); a load that works removes its model. ``producer status`` shows them."""
    return f"diffq:{campaign_of(queue)}:load-failures"


def enqueued_key(queue: str) -> str:
    return f"diffq:{campaign_of(queue)}:enqueued"


def by_model_key(queue: str) -> str:
    """The campaign's images by model: ``<model>:enqueued`` and ``<model>:written`` (the ledger's
    scripts count them with the totals, so the two never disagree; ``producer status`` shows them)."""
    return f"diffq:{campaign_of(queue)}:by-model"


def checked_key(queue: str) -> str:
    """Fingerprints of prompts files (content and flags) that passed ``producer enqueue``'s check."""
    return f"diffq:{campaign_of(queue)}:checked"


def seen_key(queue: str) -> str:
    """``<host>\t<output>`` of the hosts where a local output folder was seen: by a producer
    that found it, or by a worker that wrote into it. If it is gone later on such a host, it was
    deleted (its images are made again), not merely out of this host's sight."""
    return f"diffq:{campaign_of(queue)}:seen"


def seen_member(output: str) -> str:
    """This host's member of :func:`seen_key` for a local ``output`` (as the job names it)."""
    return f"{socket.gethostname()}\t{output}"


def cancelled_key(queue: str) -> str:
    """When ``producer cancel`` last cancelled the queue's campaign: an enqueue that began before
    stops topping the queue up."""
    return f"diffq:{campaign_of(queue)}:cancelled-at"


def finished_key(queue: str) -> str:
    """Jobs finished since the campaign began (RQ's finished registry keeps only the newest)."""
    return f"diffq:{campaign_of(queue)}:finished"


#: KEYS: finished registry, finished counter. ARGV: jobs to keep, most to delete in one call,
#: RQ's job key prefix, RQ's results key prefix (see :mod:`common.rq_keys`).
#: Counts one finished job, then deletes the oldest finished jobs (hash and result stream) past
#: the newest ``keep``. A finished job costs ~6.4 KB (its result is a Redis stream, ~4.7 KB even
#: for one entry); 1.25 M of them, a 10^7-image campaign, would be 8 GB. Nothing needs them:
#: the ledger says which items are done, and the counters what status shows.
RETIRE_FINISHED = """
redis.call('INCR', KEYS[2])
local keep = tonumber(ARGV[1])
if keep <= 0 then return 0 end
local extra = redis.call('ZCARD', KEYS[1]) - keep
if extra <= 0 then return 0 end
extra = math.min(extra, tonumber(ARGV[2]))
local ids = redis.call('ZRANGE', KEYS[1], 0, extra - 1)
for _, id in ipairs(ids) do
  redis.call('UNLINK', ARGV[3] .. id, ARGV[4] .. id)
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, extra - 1)
return extra
"""


def retire_finished(conn: redis.Redis, queue: str, keep: int, most: int = 1000) -> int:
    """Count a finished job and delete the oldest finished jobs past ``keep``; returns how many."""
    script = conn.register_script(RETIRE_FINISHED)
    rq = rq_names()
    keys = [finished_registry_key(queue), finished_key(queue)]
    return int(script(keys=keys, args=[keep, most, rq.job_prefix, rq.results_prefix]))
