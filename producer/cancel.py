"""``producer cancel``: stop a campaign without losing what it made.

Queued and retrying jobs are taken off the queue and marked ``canceled`` in RQ (its canceled
registry lists them, as rq-dashboard shows); running jobs are stopped through RQ's own
``stop-job`` command, which a diffq worker serves between two denoising steps, before any image
of the job is written (they end ``stopped``); jobs taken but not started, or lost, are
cancelled too. Images already written stay written and recorded. The items of every cancelled
or stopped job are left pointing at it, so the ledger says they are not done: ``producer
status`` counts them as cancelled, and the same ``producer enqueue`` queues them again (an item
whose job ended without making it is free, :mod:`common.ledger`).

A producer still topping the queue up (``--max-queued``) when the campaign is cancelled stops
instead of queuing more: :func:`cancel` leaves a mark with its time, and an enqueue that began
before it gives up at its next look at the queue.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis
from rq.command import send_stop_job_command
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, DeferredJobRegistry, ScheduledJobRegistry
from rq.serializers import JSONSerializer

from common.lanes import lanes
from common.queues import cancelled_key, get_queue
from common.reconcile import intermediate_key, left, spec_images

#: jobs taken off the queue per round trip
BATCH = 1000


@dataclass
class CancelReport:
    queued: int = 0
    retrying: int = 0
    starting: int = 0
    running: list[tuple[str, str]] = field(default_factory=list)  # (job id, worker) asked to stop
    images: int = 0  # images of the cancelled and stopped jobs: none of them will be written

    @property
    def jobs(self) -> int:
        return self.queued + self.retrying + self.starting + len(self.running)


def _cancel_all(conn: redis.Redis, queue: str, ids: list[str], report: CancelReport, dry_run: bool) -> int:
    """Mark ``ids`` (already off every list) canceled, as RQ's ``Job.cancel`` does without its
    per-job ``LREM`` over the whole queue (10^5 jobs would scan 10^10 entries)."""
    jobs = [j for j in Job.fetch_many(ids, connection=conn, serializer=JSONSerializer) if j is not None]
    if dry_run:
        report.images += sum(spec_images(j) for j in jobs)
        return len(jobs)
    registry = CanceledJobRegistry(queue, connection=conn, serializer=JSONSerializer)
    with conn.pipeline() as pipe:
        for job in jobs:
            report.images += spec_images(job)
            job.meta["error"] = "cancelled by producer cancel; producer enqueue of its prompts file queues it again"
            pipe.hset(job.key, "meta", JSONSerializer.dumps(job.meta))  # as Job.save_meta, in the pipeline
            job.set_status(JobStatus.CANCELED, pipeline=pipe)
            registry.add(job, pipeline=pipe)
        pipe.execute()
    return len(jobs)


def cancel(conn: redis.Redis, queue: str, *, ttl: float, dry_run: bool = False) -> CancelReport:
    """Cancel every job of the campaign ``queue`` that is not over, in both its lanes
    (:mod:`common.lanes`; see the module docstring)."""
    report = CancelReport()
    if not dry_run:
        conn.set(cancelled_key(queue), time.time())  # a running enqueue sees it, stops, says where
    for lane in lanes(queue):
        _cancel_lane(conn, lane, report, ttl=ttl, dry_run=dry_run)
    return report


def _cancel_lane(conn: redis.Redis, queue: str, report: CancelReport, *, ttl: float, dry_run: bool) -> None:
    q = get_queue(queue, conn)
    # 1. queued: off the list a batch at a time (a worker may still pop one meanwhile: step 3 stops it)
    if dry_run:
        ids = [i.decode() for i in conn.lrange(q.key, 0, -1)]
        report.queued += _cancel_all(conn, queue, ids, report, dry_run=True)
    else:
        while batch := conn.lpop(q.key, BATCH):
            report.queued += _cancel_all(conn, queue, [i.decode() for i in batch], report, dry_run=False)
    # 2. waiting for a retry or a dependency
    for registry in (ScheduledJobRegistry(queue, connection=conn), DeferredJobRegistry(queue, connection=conn)):
        ids = registry.get_job_ids()
        if not dry_run:
            for jid in ids:
                registry.remove(jid)
        report.retrying += _cancel_all(conn, queue, ids, report, dry_run)
    # 3. running: RQ's stop-job to the worker that runs it; taken or lost: cancelled here
    place = left(conn, queue, ttl=ttl, lane=queue)
    for jid in q.started_job_registry.get_job_ids(cleanup=False):
        if jid in place.lost_ids:
            continue
        try:
            job = Job.fetch(jid, connection=conn, serializer=JSONSerializer)
        except NoSuchJobError:
            continue
        report.images += spec_images(job)
        report.running.append((jid, job.worker_name or "?"))
        if not dry_run and job.worker_name:
            try:
                send_stop_job_command(conn, jid)
            except InvalidJobOperation:  # it finished meanwhile
                report.running.pop()
    stuck = [i.decode() for i in conn.lrange(intermediate_key(queue), 0, -1)] + place.lost_ids
    stuck = [jid for jid in dict.fromkeys(stuck) if jid not in {r for r, _ in report.running}]
    if not dry_run:
        for jid in stuck:
            conn.lrem(intermediate_key(queue), 0, jid)
            for entry in conn.zrange(q.started_job_registry.key, 0, -1):
                if entry.decode().startswith(f"{jid}:"):
                    conn.zrem(q.started_job_registry.key, entry)
    report.starting += _cancel_all(conn, queue, stuck, report, dry_run)


def describe(report: CancelReport, queue: str, dry_run: bool) -> list[str]:
    would = "would cancel" if dry_run else "cancelled"
    lines = [
        f"queue {queue!r}: {would} {report.jobs} job(s), {report.images} image(s) not yet written: "
        f"{report.queued} queued, {report.retrying} retrying, {report.starting} taken or lost, "
        f"{len(report.running)} running"
        + (" (asked to stop at their next step)" if report.running and not dry_run else "")
    ]
    lines += [f"  {'would stop' if dry_run else 'stopping'} {jid} on {worker}" for jid, worker in report.running]
    if dry_run:
        lines.append("dry run: nothing was changed")
    else:
        lines.append("images already written stay; the same producer enqueue resumes the campaign")
    return lines
