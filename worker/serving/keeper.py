"""The keeper: a worker's background thread, and its duties, each a named part.

The main thread runs jobs (a denoise is seconds of GPU work with no Redis call in it), so
everything that must happen on a clock happens here, every ``keepalive_s`` (a sixth of
``DIFFQ_HEARTBEAT_TTL``):

1. :meth:`Keeper.renew_heartbeats`: the worker's own key, the running job's execution, and a
   job whose images are still in the writer (overlap); only executions still in the started
   registry, so a worker back from a stall never takes back a job given away.
2. :meth:`Keeper.watch_lease`: the GPU lease, where the worker took one (compose's
   ``--gpu-lease``; the lease renews itself from the moment it is taken); a lease another
   worker took stops this one after its job.
3. :meth:`Keeper.move_due_retries`: retries whose backoff is over, from RQ's scheduled
   registry back to the queue (RQ's scheduler, under its lock).
4. :meth:`Keeper.publish_pauses`: why the worker takes no jobs (a full disk, a model it failed
   to load), for ``producer status``.
5. The worker's own hook, ``keep_more`` (an xDiT group's rank 0 watches its peers there).
6. :meth:`Keeper.reap`: every ``reap_s`` (a third of the TTL), jobs of dead workers back to
   their queue (:mod:`worker.serving.recovery`).

A failing duty (Redis away) is logged with a count and retried on the next tick; the keeper
never dies of it. Fields it shares with the main thread are the worker's, under the worker's
``_executions_lock`` where both write.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from common.queues import paused_key
from worker.serving.recovery import requeue_abandoned

log = logging.getLogger("diffq.worker")


class Keeper:
    """``worker`` is the :class:`~worker.serving.rqworker.DiffqWorker` it keeps (typed loosely:
    the worker imports the keeper, not the other way round)."""

    name = "keeper"

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.failures = 0  # ticks in a row that failed
        self._stop = threading.Event()
        self._last_reap = 0.0

    def start(self) -> None:
        self._stop.clear()
        threading.Thread(target=self.run, name="diffq-keeper", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.wait(self.worker.keepalive_s):
            try:
                self.tick()
                self.failures = 0
            except Exception as exc:  # the keeper must outlive Redis hiccups, and say so
                self.failures += 1
                log.warning(
                    "keeper: %s: %s (%d failure(s) in a row; a running job is given to another worker "
                    "if its heartbeat lapses for %ds)",
                    exc.__class__.__name__,
                    exc,
                    self.failures,
                    self.worker.heartbeat_ttl,
                )

    def tick(self) -> None:
        """One round of every duty, in the order the module docstring gives."""
        self.renew_heartbeats()
        self.watch_lease()
        self.move_due_retries()
        self.publish_pauses()
        self.worker.keep_more()
        if time.monotonic() - self._last_reap >= self.worker.reap_s:
            self._last_reap = time.monotonic()
            self.reap()

    def renew_heartbeats(self) -> None:
        worker = self.worker
        with worker._executions_lock:  # not while the main thread completes a handed-off job
            pending = worker.tails.pending
            if pending is not None and worker.owns(pending.job, pending.execution):
                worker.maintain_heartbeats(pending.job, pending.execution)
            self._renew_running()

    def _renew_running(self) -> None:
        worker = self.worker
        now = worker._now  # one read: the job and its execution together (worker/serving/states.py)
        if now is None:
            worker.heartbeat(worker.worker_ttl)  # idle or paused: still alive, for producer status
            return
        job, execution = now.job, now.execution
        if execution is None or worker._lost == job.id:
            return
        if worker.owns(job, execution):
            worker.maintain_heartbeats(job, execution)
            return
        worker._lost = job.id
        log.warning(
            "job %s: its heartbeat lapsed (was this worker stalled?) and it went to another worker; "
            "this worker finishes its part but records nothing",
            job.id,
        )

    def watch_lease(self) -> None:
        worker = self.worker
        if worker.lease is not None and not worker.lease_lost and worker.lease.lost.is_set():
            worker.lease_lost = True
            worker._stop_requested = True
            log.error("GPU lease %s was taken by another worker; stopping after this job", worker.lease.index)

    def move_due_retries(self) -> None:
        scheduler = self.worker._scheduler
        if scheduler is not None and scheduler.acquire_locks():
            try:
                scheduler.enqueue_scheduled_jobs()
            finally:
                scheduler.release_locks()

    def publish_pauses(self) -> None:
        worker = self.worker
        refusing = worker.runtime.breaker.open() if worker.runtime is not None else {}
        pause = worker.pauses.now
        reasons = [pause.reason] if pause else []
        reasons += [f"not taking jobs for {what}: {why}" for what, why in refusing.items()]
        key = paused_key(worker.queues[0].name)
        if reasons:
            worker.connection.hset(key, worker.name, json.dumps({"reasons": reasons, "since": time.time()}))
        else:
            worker.connection.hdel(key, worker.name)

    def reap(self) -> None:
        for queue in self.worker.queues:
            requeue_abandoned(queue, stuck_after_s=self.worker.heartbeat_ttl)
