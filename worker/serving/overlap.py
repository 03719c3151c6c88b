"""A job's tail on a writer thread while the next job denoises.

A job's GPU part ends with its images in memory. Writing them (PNG encode, temp file, fsync,
rename), appending their metadata lines and committing the ledger took 0.2–0.3 s of a 9 s
job on an H100: 3 % of the GPU's time, idle. With overlap on (the default), the job function
hands that tail to one writer thread and returns the dict the tail fills (the job's result);
the worker takes the next job at once and
completes the previous one in RQ (finished, result, execution cleaned up) on its main thread
as soon as the tail is done: between two denoising steps of the next job, or before it waits
for work, or before it exits.

Bounded: one tail at a time. A job that reaches its own tail while the previous one is still
writing waits for it, so at most two jobs' images are in memory.

Nothing lost: until RQ completes it, a handed-off job stays in RQ's started registry under its
own execution, and the keeper renews that execution's heartbeat. If the worker dies with
images in the writer, the heartbeat lapses and the job is re-queued like any running job: the
retry keeps the files the writer finished (names come from content) and makes the rest, and
the ledger records each item once whichever execution gets there (see :mod:`common.ledger`).
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import redis
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue

from worker.serving.context import Tail
from worker.serving.signals import COLD_EXIT_S

log = logging.getLogger("diffq.worker")


@dataclass
class Pending:
    """A job whose tail the writer has, and the RQ state needed to complete it later: RQ 3
    completes a job under the execution passed to it, so two executions of one worker (the
    pending job's and the running one's) never get in each other's way."""

    job: Job
    queue: Queue
    registry: Any
    execution: Execution
    future: Future[dict[str, Any]]


class Writer:
    """One thread that runs job tails in the order they were handed over."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffq-writer")

    def submit(self, tail: Tail) -> tuple[dict[str, Any], Future[dict[str, Any]]]:
        """Run ``tail`` on the writer. Returns the dict it fills with its result (the job
        function returns it, and RQ saves it when the worker completes the job) and its future."""
        result: dict[str, Any] = {}

        def run() -> dict[str, Any]:
            result.update(tail())
            return result

        return result, self._pool.submit(run)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class Tails:
    """The overlap as a part of the worker: the writer, the job whose tail it has (``pending``)
    and its completion in RQ on the main thread. ``worker`` is the RQ worker (typed loosely, as
    the keeper's): the completion runs its ``handle_exception``, ``handle_job_failure`` and
    ``handle_job_success`` as ``perform_job`` would have. ``lock`` is the worker's, held by the
    keeper while it renews heartbeats: a job is never completed while its heartbeat is renewed."""

    name = "tails"

    def __init__(self, worker: Any, lock: threading.RLock, *, overlap: bool) -> None:
        self.worker = worker
        self.lock = lock
        self.writer = Writer() if overlap else None
        self.pending: Pending | None = None
        #: the running job's tail, once its job function handed it to the writer
        self.handed: Future[dict[str, Any]] | None = None

    def start(self) -> None:
        """Nothing to start: the writer's thread starts with its first tail."""

    def stop(self) -> None:
        """The last tail completed (or left to its heartbeat if Redis is away), the writer shut."""
        self.finish_on_the_way_out()
        if self.writer is not None:
            self.writer.shutdown()

    def hand_off(self, tail: Tail) -> dict[str, Any]:
        """Called by the job function once its images are made: at most one tail in the writer.
        Returns the dict the tail fills, which the job function returns as its result."""
        self.finish()
        assert self.writer is not None
        result, self.handed = self.writer.submit(tail)
        return result

    def keep(self, job: Job, queue: Queue, registry: Any, execution: Execution) -> bool:
        """At RQ's success of the running job: if its tail is in the writer, keep the job to be
        completed when the writer is done (True); else RQ completes it now (False)."""
        handed, self.handed = self.handed, None
        if handed is None:
            return False
        self.pending = Pending(job, queue, registry, execution, handed)
        return True

    def execution_of(self, job: Job) -> Execution | None:
        pending = self.pending
        return pending.execution if pending is not None and pending.job.id == job.id else None

    def ready(self) -> bool:
        """A tail is in the writer and done: completing it now waits for nothing."""
        return self.pending is not None and self.pending.future.done()

    def finish(self) -> None:
        """Wait for the writer, then complete the handed-off job in RQ as ``perform_job`` would
        have: success, or the failure path (a full disk gives it back and pauses the worker; a
        lost job records nothing)."""
        pending = self.pending
        if pending is None:
            return
        wait([pending.future])  # the keeper heartbeats the job meanwhile
        with self.lock:  # self.pending stays set meanwhile: its job's execution is asked for
            job, queue, registry, execution = pending.job, pending.queue, pending.registry, pending.execution
            try:
                pending.future.result()  # the job's result is the dict it filled
            except Exception:  # handle_job_failure reads the exception from sys.exc_info()
                exc_info = sys.exc_info()
                exc_string = "".join(traceback.format_exception(*exc_info))
                self.worker.handle_exception(job, *exc_info)
                self.worker.handle_job_failure(job, queue, registry, exc_string, execution=execution)
            else:
                self.worker.handle_job_success(job, queue, registry, execution)
            finally:
                self.pending = None

    def finish_on_the_way_out(self) -> None:
        """:meth:`finish`, with a Redis that does not answer said, not raised: the job comes
        back by its heartbeat."""
        try:
            self.finish()
        except redis.RedisError as exc:
            log.warning("the job in the writer was not completed in RQ (%s); it comes back by its heartbeat",
                        exc.__class__.__name__)  # fmt: skip

    def give_back(self, reason: str, lost: str | None = None) -> None:
        """A cold stop: the job in the writer goes back to the front of its queue (unless it is
        ``lost``, another worker's now). Whatever the writer records after this is fenced out;
        the files it finished are kept by the retry."""
        held = self.lock.acquire(timeout=COLD_EXIT_S / 4)  # not while the main thread completes it
        try:
            pending, self.pending = self.pending, None
        finally:
            if held:
                self.lock.release()
        if pending is not None and lost != pending.job.id:
            self.worker.give_back(pending.job, pending.queue, reason, execution=pending.execution)
