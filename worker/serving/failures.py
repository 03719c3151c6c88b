"""Failure classification: which errors are worth retrying, and the one line a user reads.

A job that can never succeed as written (bad payload, unknown model, missing adapter,
unwritable output) fails at once: retrying would only burn GPU time and delay the answer.
Anything else (a flaky filesystem, a dropped connection, a driver hiccup) is retried with
RQ's backoff up to the job's limit. The worker process survives all of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import TracebackType

from rq.exceptions import DeserializationError
from rq.job import Job

from common.errors import DiffqError, InvalidJobSpec, NotServedHere, PermanentJobError

log = logging.getLogger("diffq.worker")

#: a model or adapter that fails to load the same way on this many distinct workers is the job's fault
SAME_FAILURE_WORKERS = 2


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


def refused_here(
    job: Job | None, worker: str, what: str, exc: DiffqError, here: NotServedHere | None = None
) -> DiffqError:
    """What to raise when this worker cannot serve ``what`` (a model or adapter it cannot load,
    an output folder it cannot write) for ``job``.

    A broken file in this worker's cache, a mount it lacks, a driver, full memory, a folder it
    may not write: none of it is the job's fault, and a healthy worker would run the job. So the
    job is given back for other workers (``here``, a :class:`~common.errors.NotServedHere`,
    retries untouched), and each worker's reason is kept in ``job.meta['load_failures']``. Only
    when :data:`SAME_FAILURE_WORKERS` distinct workers failed the same way is the failure the
    job's own (a typo in a hub id, a file where its folder should be): then ``exc``, which
    fails the job for good."""
    if job is None:
        return exc
    seen: dict[str, str] = job.meta.setdefault("load_failures", {})
    seen[worker] = str(exc)
    job.save_meta()
    if sum(reason == str(exc) for reason in seen.values()) >= SAME_FAILURE_WORKERS:
        return exc
    return here or NotServedHere(f"{what} does not load on this worker ({exc}); given back for another worker")


@dataclass
class FailureLog:
    """One log line per failure, and a reason that repeats counted rather than repeated: a
    campaign of 10⁵ jobs with one bad column says it once, then at 10, 100, 1000 and every
    10,000, with the count (the traceback is at DEBUG, and in rq-dashboard)."""

    #: each cause said, and how often it happened
    told: dict[str, int] = field(default_factory=dict)

    def say(self, job_id: str, exc: BaseException, failure: Failure) -> None:
        cause = f"{type(exc).__name__}: {failure.reason}"
        times = self.told[cause] = self.told.get(cause, 0) + 1
        if times == 1 or times in (10, 100, 1000) or times % 10000 == 0:
            again = f" (the same reason {times} times so far)" if times > 1 else ""
            log.error("job %s failed: %s%s", job_id, failure.reason, again)
