"""The RQ worker class: in-process execution (no fork) with heartbeats kept from inside jobs.

RQ's default ``Worker`` forks a work-horse per job: CUDA does not survive ``fork`` and the
child would load the model again for every job. ``SimpleWorker`` runs jobs in-process, but
then nothing refreshes the worker's and the job's heartbeats while a long job runs; we do it
from the diffusion step callback through :meth:`DiffqWorker.keepalive`.
"""

from __future__ import annotations

import os
import socket
import time

from rq import SimpleWorker
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer

from worker.failures import record_failure

KEEPALIVE_INTERVAL_S = 5.0


def worker_name(gpu_label: str) -> str:
    """Names show in rq-dashboard and ``producer status``: GPU first, then host and pid."""
    host = socket.gethostname().split(".")[0]
    label = gpu_label.replace(",", "+")
    label = label if label.startswith("cpu") else f"gpu{label}"
    return f"diffq-{label}-{host}-{os.getpid()}"


class DiffqWorker(SimpleWorker):
    serializer = JSONSerializer

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("exception_handlers", [record_failure])
        super().__init__(*args, **kwargs)
        self._running: Job | None = None
        self._last_keepalive = 0.0

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._running = job
        self._last_keepalive = time.monotonic()
        try:
            super().execute_job(job, queue)
        finally:
            self._running = None

    def keepalive(self) -> None:
        """Refresh worker, execution and job heartbeats; cheap to call every diffusion step."""
        job = self._running
        now = time.monotonic()
        if job is None or self.execution is None or now - self._last_keepalive < KEEPALIVE_INTERVAL_S:
            return
        self._last_keepalive = now
        self.maintain_heartbeats(job)
