"""A campaign's two lanes: the queue every worker takes jobs from, and the one only groups take.

A campaign (``--queue Q``) is one ledger (``diffq:Q:*``) and two RQ queues:

- ``Q``: throughput work. Single-GPU workers serve it, and so do groups when they have
  nothing of their own (a group's GPUs are never idle while the campaign has work).
- ``Q:group``: jobs that need a group: ``producer enqueue --latency`` (one image sooner from
  several GPUs), or a job a single worker handed over because its model does not fit that
  worker's GPU without offloading while a group serves the campaign. Single workers never
  take from it; a group takes from it first, at every job boundary.

So neither kind starves the other: throughput jobs always have the single workers, and a group
job waits at most for the group's current job. Queue names cannot contain ``:``
(:mod:`common.settings`), so a lane never collides with a campaign of its own.

Every tool that answers a question about the campaign (what is left, what failed, cancel,
status, metrics) reads both lanes; the ledger's keys are the campaign's, whichever lane a
job came from (:func:`campaign_of` its ``origin``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rq.exceptions import DequeueTimeout
from rq.queue import Queue

#: what follows the campaign's name in its group lane's RQ queue name
GROUP_SUFFIX = ":group"

#: ``diffq:<queue>:made-by`` fields: who made the campaign's images
MADE_BY_WORKER = "worker"
MADE_BY_GROUP = "group"


def group_lane(queue: str) -> str:
    """The RQ queue of ``queue``'s jobs that only a group takes."""
    return campaign_of(queue) + GROUP_SUFFIX


def lanes(queue: str) -> tuple[str, str]:
    """Both RQ queues of the campaign ``queue``: the shared one first."""
    campaign = campaign_of(queue)
    return campaign, campaign + GROUP_SUFFIX


def campaign_of(rq_queue: str) -> str:
    """The campaign (the ledger's name) of an RQ queue: its own name, or its group lane's owner."""
    return rq_queue.removesuffix(GROUP_SUFFIX)


def is_group_lane(rq_queue: str) -> bool:
    return rq_queue.endswith(GROUP_SUFFIX)


def made_by_key(queue: str) -> str:
    """Images of the campaign by who made them (:data:`MADE_BY_WORKER`, :data:`MADE_BY_GROUP`)."""
    return f"diffq:{campaign_of(queue)}:made-by"


#: seconds a worker of several lanes blocks on the first before it looks at the others again
LANE_POLL_S = 1


class LaneQueue(Queue):
    """RQ's queue, taking jobs lane by lane in order for a worker of several (a group: its group
    lane first, then the campaign's own).

    RQ pops several queues with ``BLPOP``, which skips its intermediate list: a worker killed
    between the pop and registering the job would lose it for good, where one queue's ``BLMOVE``
    leaves it where the reconciler finds it (:mod:`common.reconcile`). So each lane is taken
    with ``LMOVE``, the first lane waited on ``BLMOVE`` :data:`LANE_POLL_S` at a time; a job of
    a later lane waits at most that long for a worker that is idle."""

    @classmethod
    def dequeue_any(
        cls,
        queues: Iterable[Queue],
        timeout: int | None,
        connection: Any,
        job_class: Any = None,
        serializer: Any = None,
        death_penalty_class: Any = None,
    ) -> tuple[Any, Queue] | None:
        kwargs = {"job_class": job_class, "serializer": serializer, "death_penalty_class": death_penalty_class}
        ordered = list(queues)
        if len(ordered) == 1:
            return super().dequeue_any(ordered, timeout, connection=connection, **kwargs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            for queue in ordered:  # one queue and no timeout: a non-blocking LMOVE
                result = super().dequeue_any([queue], None, connection=connection, **kwargs)
                if result is not None:
                    return result
            if deadline is None:
                return None
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise DequeueTimeout(timeout, [q.key for q in ordered])
            try:
                result = super().dequeue_any([ordered[0]], max(1, min(LANE_POLL_S, int(wait))), connection=connection,
                                             **kwargs)  # fmt: skip
            except DequeueTimeout:
                continue
            if result is not None:
                return result
