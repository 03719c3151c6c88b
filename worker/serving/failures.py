"""Failure classification: which errors are worth retrying, and the one line a user reads.

A job that can never succeed as written (bad payload, unknown model, missing adapter,
unwritable output) fails at once: retrying would only burn GPU time and delay the answer.
Anything else (a flaky filesystem, a dropped connection, a driver hiccup) is retried with
RQ's backoff up to the job's limit. The worker process survives all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType

from rq.exceptions import DeserializationError
from rq.job import Job

from common.errors import DiffqError, InvalidJobSpec, PermanentJobError


@dataclass(frozen=True)
class Failure:
    permanent: bool
    reason: str


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, PermanentJobError | InvalidJobSpec):
        return Failure(True, str(exc))
    if isinstance(exc, DeserializationError):
        return Failure(True, "payload is not a diffq JSON job (rejected unread; only JSON jobs run)")
    if isinstance(exc, DiffqError):
        return Failure(False, str(exc))
    lines = str(exc).strip().splitlines()
    detail = f": {lines[0]}" if lines else ""
    return Failure(False, f"{exc.__class__.__name__}{detail}")


def record_failure(job: Job, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> bool:
    """RQ exception handler: stop retries of permanent failures and keep a one-line reason in
    ``job.meta['error']`` for ``producer status`` and rq-dashboard. Returns True so RQ goes on
    with its own handling (failed registry, or retry)."""
    failure = classify(exc)
    if failure.permanent:
        job.retries_left = 0
    retrying = bool(job.retries_left)
    job.meta["error"] = failure.reason + (" (retrying)" if retrying else "")
    job.meta["permanent"] = failure.permanent
    job.save_meta()
    return True
