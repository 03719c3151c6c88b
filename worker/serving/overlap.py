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

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue

from worker.serving.context import Tail


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
