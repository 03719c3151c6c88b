"""The RQ worker class: in-process execution (no fork), heartbeats from a keeper thread,
fast recovery of dead workers' jobs, and shutdowns that lose nothing.

RQ's default ``Worker`` forks a work-horse per job: CUDA does not survive ``fork`` and the
child would load the model again for every job. ``SimpleWorker`` runs jobs in-process, but
then nothing refreshes the worker's and the job's heartbeats while a long job runs (model
load, a 30-step batch at 1024²). Three things are added here:

- A keeper thread renews the heartbeats of the worker, the execution and the job every
  :data:`KEEPALIVE_INTERVAL_S` while a job runs (the diffusion step callback also reports
  progress into ``job.meta``), and re-queues jobs of dead workers every
  :data:`REAP_INTERVAL_S` (see :mod:`worker.recovery`). A job that hangs is ended by its
  timeout, which RQ enforces in the main thread.
- Ctrl-C / SIGTERM: finish the current job, take no new one, exit 0. A second signal stops
  at once (exit 1) and puts the interrupted job back at the front of its queue without
  using one of its retries.
- RQ's scheduler runs in a child process that outlives a SIGKILLed worker; instead the keeper
  moves retries that are due from the scheduled registry back to the queue.
- ``--burst`` does not quit while jobs of its queues wait in the scheduled registry for a
  retry backoff: a burst run ends when the work is done, not when the list is momentarily empty.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from types import FrameType
from typing import Any

from rq import SimpleWorker
from rq.job import Job
from rq.queue import Queue
from rq.registry import ScheduledJobRegistry
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from worker.failures import record_failure
from worker.lease import GpuLease
from worker.recovery import HEARTBEAT_TTL_S, KEEPALIVE_INTERVAL_S, REAP_INTERVAL_S, requeue_abandoned

log = logging.getLogger("diffq.worker")

#: exit status after a cold (second-signal) stop
EXIT_COLD = 1
#: exit status when this worker's GPU lease was taken by another (the supervisor restarts it)
EXIT_LEASE_LOST = 3
#: a worker's own key expires this long after its last heartbeat (RQ default 420 s)
WORKER_TTL_S = 60


def worker_name(gpu_label: str) -> str:
    """Names show in rq-dashboard and ``producer status``: GPU first, then host and pid."""
    host = socket.gethostname().split(".")[0]
    label = gpu_label.replace(",", "+")
    label = label if label.startswith("cpu") else f"gpu{label}"
    return f"diffq-{label}-{host}-{os.getpid()}"


class ColdShutdown(SystemExit):
    """Raised in the main thread by the second Ctrl-C / SIGTERM."""


class DiffqWorker(SimpleWorker):
    serializer = JSONSerializer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("exception_handlers", [record_failure])
        kwargs.setdefault("worker_ttl", WORKER_TTL_S)
        kwargs.setdefault("job_monitoring_interval", int(KEEPALIVE_INTERVAL_S))
        self.lease: GpuLease | None = kwargs.pop("lease", None)
        self.lease_lost = False
        super().__init__(*args, **kwargs)
        self._running: Job | None = None
        self._cold = False
        self._cold_code = EXIT_COLD
        self._cold_reason = ""
        self._keeper_stop = threading.Event()
        self._keeper: threading.Thread | None = None

    # -- heartbeats and recovery ------------------------------------------------------------

    def get_heartbeat_ttl(self, job: Job) -> int:
        """Short, so a dead worker's job is noticed in seconds; the keeper renews it."""
        return HEARTBEAT_TTL_S

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        super().bootstrap(*args, **kwargs)
        self._keeper_stop.clear()
        self._keeper = threading.Thread(target=self._keep, name="diffq-keeper", daemon=True)
        self._keeper.start()

    def teardown(self) -> None:
        self._keeper_stop.set()
        super().teardown()

    def _keep(self) -> None:
        last_reap = 0.0
        while not self._keeper_stop.wait(KEEPALIVE_INTERVAL_S):
            try:
                job = self._running
                if job is not None and self.execution is not None:
                    self.maintain_heartbeats(job)
                if self.lease is not None and not self.lease_lost and not self.lease.renew():
                    self.lease_lost = True
                    self._stop_requested = True
                    log.error("GPU lease %s was taken by another worker; stopping after this job", self.lease.index)
                self._enqueue_due_retries()
                self.keep_more()
                if time.monotonic() - last_reap >= REAP_INTERVAL_S:
                    last_reap = time.monotonic()
                    for queue in self.queues:
                        requeue_abandoned(queue)
            except Exception as exc:  # the keeper must outlive Redis hiccups
                log.debug("keeper: %s: %s", exc.__class__.__name__, exc)

    def keep_more(self) -> None:
        """More keeper work for subclasses (an xDiT group's rank 0 watches its peers here)."""

    def clean_registries(self) -> None:
        for queue in self.queues:
            requeue_abandoned(queue)
        super().clean_registries()

    # -- jobs and shutdown ------------------------------------------------------------------

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._running = job
        try:
            super().execute_job(job, queue)
        finally:
            self._running = None
        if self._cold:
            raise ColdShutdown(self._cold_code)

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        # the same signal delivered twice within a second (launcher + terminal) counts once
        requested = self._shutdown_requested_date
        if requested is not None and time.time() - requested.timestamp() < 1:
            return
        self.log.warning("Worker %s: cold shut down: the current job goes back to the queue", self.name)
        self._cold = True
        raise ColdShutdown(EXIT_COLD)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        if self._cold:
            return  # not the job's failure: no traceback, no error recorded
        super().handle_exception(job, *exc_info)

    def handle_job_failure(
        self, job: Job, queue: Queue, started_job_registry: Any = None, exc_string: str = ""
    ) -> None:
        if not self._cold:
            # the one-line reason first: rq-dashboard shows this text as the job's exception
            reason = job.meta.get("error")
            if reason and exc_string:
                exc_string = f"{reason}\n\n{exc_string}"
            super().handle_job_failure(job, queue, started_job_registry=started_job_registry, exc_string=exc_string)
            return
        with self.connection.pipeline() as pipe:
            self.cleanup_execution(job, pipeline=pipe)
            pipe.execute()
        job.meta["error"] = self._cold_reason or f"interrupted by a cold shutdown of {self.name}; re-queued"
        job.save_meta()
        queue.enqueue_job(job, at_front=True)
        self.log.warning("Worker %s: job %s re-queued at the front", self.name, job.id)

    #: a subclass that must act while no job runs (a group's rank 0 pings its ranks) sets this
    idle_every_s: int | None = None

    def idle(self) -> None:
        """Called about every :attr:`idle_every_s` (and every burst wait) while no job runs."""

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        said = ""
        while True:
            if self._stop_requested:
                return None
            if timeout is not None and self.idle_every_s is not None:
                # wait for a job in slices, with idle() between them
                result = super().dequeue_job_and_maintain_ttl(self.idle_every_s, self.idle_every_s)
                if result is not None:
                    return result
                self.idle()
                continue
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if result is not None or timeout is not None or self._stop_requested:
                return result
            wait, why = self._unfinished_elsewhere()
            if wait is None:
                return None
            if why != said:
                self.log.info("Worker %s: burst: queue is empty but %s; waiting", self.name, why)
                said = why
            time.sleep(min(max(wait, 0.2), KEEPALIVE_INTERVAL_S))
            self._enqueue_due_retries()
            self.idle()

    def _unfinished_elsewhere(self) -> tuple[float | None, str]:
        """Work of our queues that may still come back to the queue: jobs scheduled for a retry
        (seconds until the first is due) or running on other workers (which may die and have
        their job re-queued). A burst worker waits for both before it calls the queue drained."""
        earliest: float | None = None
        running = 0
        for queue in self.queues:
            first = self.connection.zrange(ScheduledJobRegistry(queue=queue).key, 0, 0, withscores=True)
            if first:
                at = float(first[0][1])
                earliest = at if earliest is None else min(earliest, at)
            running += self.connection.zcard(queue.started_job_registry.key)
        if earliest is not None:
            return earliest - time.time(), "a retry is scheduled"
        if running:
            return KEEPALIVE_INTERVAL_S, f"{running} job(s) still run on other workers"
        return None, ""

    def _enqueue_due_retries(self) -> None:
        scheduler = RQScheduler(self.queues, connection=self.connection, serializer=self.serializer)
        if scheduler.acquire_locks():
            try:
                scheduler.enqueue_scheduled_jobs()
            finally:
                scheduler.release_locks()
