"""What one job gets from the worker that runs it, in one object passed to the job's code.

arq passes a ``ctx`` to every job function; RQ calls a job function with the job's own
arguments only. diffq does what RQ does for ``get_current_job()``: the worker makes a
:class:`JobContext` for each job and sets it in a context variable for exactly the length of
that job (:func:`enter`, :func:`leave`); :func:`worker.serving.task.run_job`, the function RQ calls, reads
it once and passes it down as the first argument of everything else (``perform(ctx, spec)``).
Nothing is installed into a module, and the job function never reaches back into the worker
except through the two callables the worker put in the context for this job.

A diffq job taken by a plain RQ worker (``rq worker`` on our queue) finds no context and gets
one built from the settings, and says so: it has no diffq heartbeats, no recovery of dead
workers' jobs and no fenced recording.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from functools import cache
from typing import Any

from common.settings import Settings
from worker.serving.runtime import Runtime

log = logging.getLogger("diffq.worker")

#: a job's tail: writes and records its images, returns the job's RQ result
Tail = Callable[[], dict[str, Any]]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class JobContext:
    runtime: Runtime
    #: this job's entry in RQ's started registry (``<job id>:<execution id>``): recording is
    #: fenced on it (see :mod:`common.ledger`); None outside a diffq worker
    execution: str | None = None
    #: takes the job's tail for the worker's writer thread and returns the dict that the tail
    #: fills (the job's result, saved by RQ once the worker completes the job); None: the job
    #: runs its tail itself (see :mod:`worker.serving.overlap`)
    hand_off: Callable[[Tail], dict[str, Any]] | None = None
    #: called between two denoising steps: the worker completes the previous job in RQ if the
    #: writer is done with it
    between_steps: Callable[[], None] = _nothing


_running: ContextVar[JobContext | None] = ContextVar("diffq_job_context", default=None)


def enter(ctx: JobContext) -> Token[JobContext | None]:
    """The worker sets the job's context once its execution exists..."""
    return _running.set(ctx)


def leave(token: Token[JobContext | None]) -> None:
    """...and takes it away when the job is over, whatever happened."""
    _running.reset(token)


def current() -> JobContext:
    """The running job's context, or one for a job that a plain RQ worker runs."""
    ctx = _running.get()
    return ctx if ctx is not None else JobContext(_plain_runtime())


@cache
def _plain_runtime() -> Runtime:
    from worker.pipelines.warm import WarmPipelines

    settings = Settings.load()
    log.warning(
        "diffq job run by a plain RQ worker: no heartbeats, no recovery of dead workers' jobs, no fenced "
        "recording; run `worker run` for those"
    )
    pipelines = WarmPipelines.from_settings(settings)
    return Runtime(settings, pipelines)
