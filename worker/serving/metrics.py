"""What one worker did, for a fleet's Prometheus: images written, jobs by outcome, job time,
failures by class and pauses by reason, labelled with the worker and its GPU.

Counts are kept in this process (``prometheus_client``'s own registry, one per worker) and
served on ``--metrics-port`` (``DIFFQ_METRICS_PORT``; 0: off). They restart at 0 with the
process, as Prometheus counters may: ``rate()`` and ``increase()`` handle resets. The queue's
own state (jobs by place, images of the campaign) is not here: one process that reads Redis,
``producer metrics``, serves it for the whole fleet (:mod:`producer.metrics`).
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("diffq.worker")

#: job times on a GPU run from seconds (tiny, 512²) to minutes (a big batch at 2048²)
JOB_BUCKETS = (0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600, float("inf"))


class WorkerMetrics:
    """One worker's series. Every method is cheap and never raises into the job."""

    def __init__(self, worker: str, gpu: str, queue: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"worker": worker, "gpu": gpu, "queue": queue}
        names = list(self.labels)
        self._images = Counter(
            "diffq_worker_images_written", "Images this worker wrote and recorded", names, registry=self.registry
        )
        self._jobs = Counter(
            "diffq_worker_jobs",
            "Jobs this worker ended, by outcome (finished, failed, given_back, stopped, lost)",
            [*names, "outcome"],
            registry=self.registry,
        )
        self._seconds = Histogram(
            "diffq_worker_job_seconds",
            "Wall time of a finished job",
            names,
            buckets=JOB_BUCKETS,
            registry=self.registry,
        )
        self._failures = Counter(
            "diffq_worker_failures", "Failed jobs by class of failure", [*names, "kind"], registry=self.registry
        )
        self._paused = Gauge(
            "diffq_worker_paused",
            "1 while the worker takes no jobs, by reason",
            [*names, "reason"],
            registry=self.registry,
        )
        self._up = Gauge("diffq_worker_up", "1 while the worker serves", names, registry=self.registry)
        self._up.labels(**self.labels).set(1)
        self._reasons: set[str] = set()

    def serve(self, port: int, address: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` on ``port`` (a thread of prometheus_client's)."""
        start_http_server(port, addr=address, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", address, port)

    def job_finished(self, images: int, seconds: float) -> None:
        self._images.labels(**self.labels).inc(images)
        self._jobs.labels(**self.labels, outcome="finished").inc()
        self._seconds.labels(**self.labels).observe(seconds)

    def job_ended(self, outcome: str, kind: str | None = None) -> None:
        """A job that did not finish here: failed (``kind``: its failure class), given back,
        stopped on request, or lost to another worker."""
        self._jobs.labels(**self.labels, outcome=outcome).inc()
        if kind is not None:
            self._failures.labels(**self.labels, kind=kind).inc()

    def paused(self, reason: str | None) -> None:
        """The worker's pause: a short reason (``disk``, ``model``...) or None when it resumes."""
        for earlier in self._reasons:
            self._paused.labels(**self.labels, reason=earlier).set(0)
        if reason is not None:
            self._reasons.add(reason)
            self._paused.labels(**self.labels, reason=reason).set(1)
