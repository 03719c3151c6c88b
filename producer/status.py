"""Queue status from RQ's registries, plus our images counter and recent-completions window.

Every count is O(1) in Redis (list and sorted-set lengths); only running jobs and a few
failures are fetched one by one, so status stays fast with millions of jobs queued.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis
from rq import Worker
from rq.job import Job
from rq.registry import (
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer

from common.queues import RECENT_WINDOW_S, get_queue, images_key, paused_key, recent_key
from producer.progress import format_duration

MAX_FAILURES_SHOWN = 5


@dataclass
class RunningJob:
    job_id: str
    worker: str
    progress: str


@dataclass
class QueueStatus:
    queue: str
    queued: int = 0
    running: int = 0
    scheduled: int = 0
    finished: int = 0
    failed: int = 0
    images_written: int = 0
    images_per_s: float = 0.0
    jobs_per_s: float = 0.0
    running_jobs: list[RunningJob] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    #: live workers that take no jobs (or not some), and why: full disk, a model they cannot load
    paused: dict[str, list[str]] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        return self.queued + self.running + self.scheduled

    @property
    def eta_s(self) -> float | None:
        return self.pending / self.jobs_per_s if self.jobs_per_s > 0 and self.pending else None


def failure_reason(job: Job) -> str:
    """One line: what the worker recorded, else the last line of the traceback."""
    reason = job.meta.get("error") if job.meta else None
    if reason:
        return str(reason)
    text = (job.exc_info or "").strip()
    return text.splitlines()[-1] if text else "unknown (no exception recorded)"


def _progress_text(job: Job | None) -> str:
    if job is None:
        return ""
    meta = job.meta or {}
    step, steps = meta.get("step"), meta.get("steps")
    done, total = meta.get("images_done", 0), meta.get("images", "?")
    if step is None:
        return f"{done}/{total} img"
    return f"step {step}/{steps}, {done}/{total} img"


def collect(conn: redis.Redis, queue_name: str, *, details: bool = True) -> QueueStatus:
    queue = get_queue(queue_name, conn)
    kw = {"queue": queue}
    started = StartedJobRegistry(**kw)
    status = QueueStatus(queue=queue_name)
    with conn.pipeline(transaction=False) as pipe:
        pipe.llen(queue.key)
        pipe.zcard(started.key)
        pipe.zcard(ScheduledJobRegistry(**kw).key)
        pipe.zcard(DeferredJobRegistry(**kw).key)
        pipe.zcard(FinishedJobRegistry(**kw).key)
        pipe.zcard(FailedJobRegistry(**kw).key)
        pipe.get(images_key(queue_name))
        now = time.time()
        pipe.zrangebyscore(recent_key(queue_name), now - RECENT_WINDOW_S, "+inf", withscores=True)
        queued, running, scheduled, deferred, finished, failed, images, recent = pipe.execute()
    status.queued, status.running, status.scheduled = queued, running, scheduled + deferred
    status.finished, status.failed = finished, failed
    status.images_written = int(images or 0)
    status.jobs_per_s, status.images_per_s = _rates(recent, now)
    if details:
        _fill_details(conn, queue_name, status)
    return status


def _rates(recent: list[tuple[bytes, float]], now: float) -> tuple[float, float]:
    """Jobs/s and images/s over the recent window; members are ``<job id>:<images>``."""
    if len(recent) < 2:
        return 0.0, 0.0
    span = max(now - recent[0][1], 1.0)
    images = sum(int(member.rsplit(b":", 1)[1]) for member, _ in recent)
    return len(recent) / span, images / span


def _fill_details(conn: redis.Redis, queue_name: str, status: QueueStatus) -> None:
    queue = get_queue(queue_name, conn)
    started = StartedJobRegistry(queue=queue)
    running_ids = started.get_job_ids()[:50]
    for jid, job in zip(
        running_ids, Job.fetch_many(running_ids, connection=conn, serializer=JSONSerializer), strict=True
    ):
        worker = (job.worker_name if job else None) or "?"
        status.running_jobs.append(RunningJob(jid, worker, _progress_text(job)))
    status.workers = sorted(w.name for w in Worker.all(queue=queue))
    for name, raw in conn.hgetall(paused_key(queue_name)).items():
        if name.decode() in status.workers:
            status.paused[name.decode()] = json.loads(raw).get("reasons", [])
    failed_ids = FailedJobRegistry(queue=queue).get_job_ids(0, MAX_FAILURES_SHOWN - 1)
    for jid, job in zip(
        failed_ids, Job.fetch_many(failed_ids, connection=conn, serializer=JSONSerializer), strict=True
    ):
        status.failures.append((jid, failure_reason(job) if job else "job expired"))


def render(status: QueueStatus, redis_label: str) -> str:
    lines = [
        f"queue {status.queue!r} on {redis_label}",
        f"  queued    {status.queued}",
        f"  running   {status.running}",
    ]
    lines += [f"    {r.job_id} on {r.worker}: {r.progress}" for r in status.running_jobs]
    if status.scheduled:
        lines.append(f"  retrying  {status.scheduled} (waiting for their backoff)")
    lines += [
        f"  finished  {status.finished}",
        f"  failed    {status.failed}",
    ]
    lines += [f"    {jid}: {reason}" for jid, reason in status.failures]
    if status.failed > len(status.failures):
        lines.append(f"    ... {status.failed - len(status.failures)} more (producer retry-failed re-queues them)")
    lines.append(f"  images    {status.images_written} written")
    if status.images_per_s:
        eta = status.eta_s
        eta_text = f", ETA {format_duration(eta)}" if eta else ""
        lines.append(f"  rate      {status.images_per_s:.2f} img/s ({status.jobs_per_s:.2f} jobs/s){eta_text}")
    else:
        lines.append("  rate      - (no job finished in the last 10 minutes)")
    lines.append(f"  workers   {len(status.workers)}" + (": " + ", ".join(status.workers) if status.workers else ""))
    for name, reasons in sorted(status.paused.items()):
        lines += [f"  paused    {name}: {reason}" for reason in reasons]
    return "\n".join(lines)
