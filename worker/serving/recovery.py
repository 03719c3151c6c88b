"""Give jobs of dead workers back to the queue, quickly and exactly once.

A worker that is SIGKILLed, OOM-killed or preempted leaves its job in RQ's started registry
with an expiry score (the last heartbeat plus the heartbeat TTL, ``DIFFQ_HEARTBEAT_TTL``).
RQ's own clean-up runs only between jobs every ``maintenance_interval`` and re-queues an
abandoned job only while it has retries left, using one up; with a busy fleet the job could
sit there for its whole timeout. Here every live worker's keeper thread looks every third of
the TTL and puts expired jobs back at the front of their queue without using a retry: dying
is not the job's fault. A job that has killed :data:`MAX_ABANDONED` workers is failed instead,
with a reason that says so (it is likely what kills them, e.g. a host OOM).

It holds RQ's maintenance lock for the queue while it works, so it never races RQ's own
``StartedJobRegistry.cleanup`` or another worker's reaper on the same entry.
"""

from __future__ import annotations

import logging
import time

import redis
from rq import worker_registration
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.utils import parse_composite_key

from common.reconcile import intermediate_seen_key, left, live_workers
from common.rq_keys import rq_names

log = logging.getLogger("diffq.worker")

MAX_ABANDONED = 3


def maintain(queue: Queue) -> None:
    """RQ's registry maintenance (``rq.registry.clean_registries``) without its two clean-ups of
    work in flight: ``StartedJobRegistry.cleanup`` retries a dead worker's job with one of its
    retries or fails it (``AbandonedJobError``), and the intermediate list's fails a job stuck
    there. Both are this module's, which give the job back untouched (:func:`requeue_abandoned`).
    Expired entries of the finished and failed registries and dead workers' keys go as in RQ."""
    if not queue.acquire_maintenance_lock():
        return
    try:
        for registry in (FinishedJobRegistry, FailedJobRegistry):
            registry(queue.name, connection=queue.connection, serializer=queue.serializer).cleanup()
        worker_registration.clean_worker_registry(queue)
    finally:
        queue.release_maintenance_lock()


def give_back(queue: Queue, job: Job, reason: str, *, at_front: bool = True) -> None:
    """Put ``job`` back on ``queue`` with its retries untouched, saying why in ``job.meta``.

    For everything that is not the job's fault: its worker died or stalled, was stopped cold,
    lost a group rank, or cannot run it here (full disk, a model it cannot load). The caller
    has already taken the job's execution out of the started registry."""
    job.meta["error"] = reason
    job.save_meta()
    queue.enqueue_job(job, at_front=at_front)


#: KEYS: intermediate list, queue, started registry, the job's hash (``Job.key_for``). ARGV: job
#: id, RQ's ``queued`` status. A job RQ moved to its intermediate list (BLMOVE) whose worker
#: died before registering it as started: back to the front of the queue, unless it is there
#: already, runs, or is no longer queued.
_UNSTICK = """
for _, member in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if string.sub(member, 1, #ARGV[1] + 1) == ARGV[1] .. ':' then return 0 end
end
redis.call('LREM', KEYS[1], 1, ARGV[1])
if redis.call('LPOS', KEYS[2], ARGV[1]) then return 0 end
if redis.call('HGET', KEYS[4], 'status') ~= ARGV[2] then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
"""


def put_back_taken(queue: Queue, job_id: str) -> bool:
    """Put a job this worker took (it is in RQ's intermediate list, not started) back at the
    front of ``queue``, for another worker: one this worker cannot serve."""
    keys = [queue.intermediate_queue_key, queue.key, queue.started_job_registry.key, Job.key_for(job_id)]
    return bool(queue.connection.eval(_UNSTICK, len(keys), *keys, job_id, JobStatus.QUEUED.value))


def requeue_abandoned(
    queue: Queue, stuck_after_s: float = 30.0, now: float | None = None, *, me: str | None = None
) -> list[str]:
    """Re-queue (or fail) every job of ``queue`` whose worker stopped heartbeating, and every job
    lost in RQ's intermediate list; return their ids. These are the jobs
    :func:`common.reconcile.left` calls lost.

    A job is lost in the intermediate list once it was seen there for ``stuck_after_s``, or at
    once when ``me`` (the asking worker, which holds nothing there at this moment: it is between
    jobs) is the only live worker of the queue: nobody else can be about to start it.

    RQ itself fails a job stuck in the intermediate list, and only at its maintenance pass
    (every 10 minutes): a worker killed between taking a job and registering it would turn it
    into a failure; here it goes back to the queue."""
    if not queue.acquire_maintenance_lock():
        return []
    try:
        now = time.time() if now is None else now
        return _requeue_expired(queue, now) + _requeue_stuck(queue, stuck_after_s, now, me)
    finally:
        queue.release_maintenance_lock()


def _requeue_stuck(queue: Queue, stuck_after_s: float, now: float, me: str | None) -> list[str]:
    conn: redis.Redis = queue.connection
    seen_key = intermediate_seen_key(queue.name)
    ids = [raw.decode() for raw in conn.lrange(queue.intermediate_queue_key, 0, -1)]
    handled: list[str] = []
    alone = bool(ids) and me is not None and not (live_workers(conn, queue.name, stuck_after_s, now) - {me})
    for job_id in ids:
        conn.hsetnx(seen_key, job_id, now)
        first = float(conn.hget(seen_key, job_id) or now)
        if now - first < stuck_after_s and not alone:
            continue
        conn.hdel(seen_key, job_id)
        keys = [queue.intermediate_queue_key, queue.key, queue.started_job_registry.key, Job.key_for(job_id)]
        if conn.eval(_UNSTICK, len(keys), *keys, job_id, JobStatus.QUEUED.value):
            log.warning("job %s: its worker died as it took it; re-queued at the front", job_id)
            handled.append(job_id)
    for stale in set(k.decode() for k in conn.hkeys(seen_key)) - set(ids):
        conn.hdel(seen_key, stale)
    return handled


def _requeue_expired(queue: Queue, now: float) -> list[str]:
    conn: redis.Redis = queue.connection
    registry = StartedJobRegistry(queue.name, connection=conn, serializer=queue.serializer)
    handled: list[str] = []
    for raw, score in conn.zrangebyscore(registry.key, 0, now, withscores=True):
        entry = raw.decode()
        job_id, _ = parse_composite_key(entry)
        try:
            job = Job.fetch(job_id, connection=conn, serializer=queue.serializer)
        except (NoSuchJobError, DeserializationError) as exc:
            if conn.zrem(registry.key, entry):  # nothing to re-queue: only the entry goes
                log.warning("job %s: its worker stopped heartbeating and the job is gone (%s)", job_id, exc)
            continue
        if not conn.zrem(registry.key, entry):
            continue  # somebody else took it
        try:
            handled += _requeue_one(queue, job, Execution.from_composite_key(entry, conn))
        except redis.RedisError:
            # back in the registry, still expired: the next pass (any worker's) takes it again
            conn.zadd(registry.key, {entry: score})
            raise
    return handled


def _requeue_one(queue: Queue, job: Job, execution: Execution) -> list[str]:
    conn: redis.Redis = queue.connection
    job_id = job.id
    with conn.pipeline() as pipe:
        execution.delete(job, pipe)
        pipe.execute()
    if job.get_status(refresh=True) in rq_names().ended:
        return []
    abandoned = int(job.meta.get("abandoned", 0)) + 1
    job.meta["abandoned"] = abandoned
    if abandoned > MAX_ABANDONED:
        reason = f"the worker running it died {abandoned} times (killed? host out of memory?); not retried"
        job.meta.update(error=reason, permanent=True)
        job.save_meta()
        with conn.pipeline() as pipe:
            job.set_status(JobStatus.FAILED, pipeline=pipe)
            job.failed_job_registry.add(job, ttl=job.failure_ttl, exc_string=reason, pipeline=pipe)
            Result.create_failure(job, job.failure_ttl, exc_string=reason, pipeline=pipe)
            pipe.execute()
        log.warning("job %s failed: %s", job_id, reason)
    else:
        give_back(queue, job, f"its worker stopped mid-job; re-queued ({abandoned}/{MAX_ABANDONED})")
        log.warning("job %s: its worker stopped heartbeating; re-queued at the front", job_id)
    return [job_id]


def unfinished_elsewhere(queues: list[Queue], ttl: float, me: str, poll_s: float) -> tuple[float | None, str]:
    """Work of ``queues`` that is not over (:func:`common.reconcile.left`): jobs scheduled for a
    retry (seconds until the first is due), running on other workers (which may die and have
    their job re-queued), being started, or lost (re-queued here and now). A burst worker waits
    for all of them, ``poll_s`` at a time, before it calls the queue drained; None: nothing left.
    An enqueue of the campaign still reading its file is work to come: it waits for that too."""
    earliest: float | None = None
    running = starting = 0
    reading: list[str] = []
    for queue in queues:
        state = left(queue.connection, queue.name, ttl=ttl, me=me, lane=queue.name)
        if state.lost:
            back = requeue_abandoned(queue, stuck_after_s=ttl, me=me)
            if back:
                return 0.0, f"{len(back)} lost job(s) re-queued"
        first = queue.connection.zrange(ScheduledJobRegistry(queue=queue).key, 0, 0, withscores=True)
        if first:
            at = float(first[0][1])
            earliest = at if earliest is None else min(earliest, at)
        running += state.running + state.lost
        starting += state.starting
        reading += [run.describe(ttl) for run in state.enqueuing]
    if earliest is not None:
        return earliest - time.time(), "a retry is scheduled"
    if running:
        return poll_s, f"{running} job(s) still run on other workers"
    if starting:
        return poll_s, f"{starting} job(s) taken by other workers and not started yet"
    if reading:
        return poll_s, reading[0]
    return None, ""
