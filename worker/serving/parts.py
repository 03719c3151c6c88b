"""A worker built from parts, as celery builds its workers from bootsteps and dramatiq from
middleware: each duty beside running jobs is one object with a ``start`` and a ``stop``, and
the worker declares their order once (:data:`~worker.serving.rqworker.DiffqWorker.parts`).

They start in that order when the worker boots and stop in the reverse order on its way out,
so a part can rely on those before it for its whole life: the pause part is there before the
keeper publishes pauses and clears them only after the keeper stopped; the keeper renews the
heartbeats of the writer's last job until the tails part has completed it. On the way out a
Redis that does not answer stops no other part: each says so and the rest still stop.

Each part is tested alone, against a stand-in for the worker (tests/test_parts.py); the
process tests check them together.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis

log = logging.getLogger("diffq.worker")


class Part(Protocol):
    """One duty of a worker: ``start`` when the worker boots, ``stop`` on its way out."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Parts:
    """A worker's parts in their declared order."""

    def __init__(self, *order: Part) -> None:
        self.order = order

    def start(self) -> None:
        for part in self.order:
            part.start()

    def stop(self) -> None:
        """Every part's ``stop``, the last started first; a Redis error in one is said, and the
        others still stop (what Redis does not hear now comes back by the heartbeat)."""
        for part in reversed(self.order):
            try:
                part.stop()
            except redis.RedisError as exc:
                log.warning("%s: Redis did not answer on the way out (%s)", part.name, exc.__class__.__name__)
