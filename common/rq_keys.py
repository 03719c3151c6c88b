"""What diffq's Lua scripts need to know of RQ's key layout and job statuses, taken from rq.

A script runs inside Redis and cannot ask rq, so every key name and status it uses is passed
in from here, never written into it: an rq release that moves a key or adds a status changes
what is passed, and tests/test_rq_boundary.py runs the scripts against the installed rq.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.results import Result


@dataclass(frozen=True)
class RqNames:
    #: a job's hash is this plus its id (``Job.key_for``)
    job_prefix: str
    #: a job's results stream is this plus its id (``Result.get_key``)
    results_prefix: str
    #: the set of all queues' keys (``Queue.redis_queues_keys``)
    queues_key: str
    #: statuses after which a job runs no more. Every other status, rq 3's ``created``,
    #: ``rate_limited`` and ``ready_to_enqueue`` and any later one included, counts as live:
    #: an item of a live job is never queued again.
    ended: frozenset[str]

    def ended_arg(self) -> str:
        """The ended statuses as one script argument, comma-separated."""
        return ",".join(sorted(self.ended))


@cache
def rq_names() -> RqNames:
    job_id = "diffq-probe"
    job_key, results_key = Job.key_for(job_id), Result.get_key(job_id)
    assert job_key.endswith(job_id) and results_key.endswith(job_id)
    ended = {JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED}
    return RqNames(
        queues_key=Queue.redis_queues_keys,
        job_prefix=job_key[: -len(job_id)],
        results_prefix=results_key[: -len(job_id)],
        ended=frozenset(status.value for status in ended),
    )


def finished_registry_key(queue: str) -> str:
    """RQ's finished registry of ``queue`` (no connection needed to name it)."""
    return FinishedJobRegistry(queue, connection=None).key  # type: ignore[arg-type]


def failed_registry_key(queue: str) -> str:
    """RQ's failed registry of ``queue`` (jobs stopped on request land there too)."""
    return FailedJobRegistry(queue, connection=None).key  # type: ignore[arg-type]


def canceled_registry_key(queue: str) -> str:
    """RQ's canceled registry of ``queue`` (``producer cancel``)."""
    return CanceledJobRegistry(queue, connection=None).key  # type: ignore[arg-type]


def started_registry_key(queue: str) -> str:
    """RQ's started registry of ``queue``: the executions running now, fenced on by the ledger."""
    return StartedJobRegistry(queue, connection=None).key  # type: ignore[arg-type]


def queue_key(queue: str) -> str:
    """The list RQ pops ``queue``'s job ids from."""
    return Queue.redis_queue_namespace_prefix + queue
