"""Which workers are alive, read without changing Redis.

RQ's ``Worker.all`` removes a worker from ``rq:workers`` when its hash has expired
(``Worker.find_by_key`` runs ``SREM``), so ``producer status``, the dashboard's Workers page or a
healthcheck that happened to look just after a killed worker's key expired changed the campaign's
keys. Every tool of diffq that lists workers builds them with :class:`SeenWorker`, whose lookup
only leaves such a worker out; the workers' own maintenance (``recovery.maintain``) prunes it.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from rq import Queue, Worker


class SeenWorker(Worker):
    """``rq.Worker`` whose ``all()`` and ``find_by_key()`` only read."""

    @classmethod
    def find_by_key(cls, worker_key: str, connection: redis.Redis, **kwargs: Any) -> Worker | None:
        if not worker_key.startswith(cls.redis_worker_namespace_prefix):
            raise ValueError(f"Not a valid RQ worker key: {worker_key}")
        if not connection.exists(worker_key):
            return None  # expired: left out, not removed (RQ's own lookup SREMs it here)
        name = worker_key[len(cls.redis_worker_namespace_prefix) :]
        worker = cls([], name, connection=connection, prepare_for_work=False, **kwargs)
        worker.refresh()
        return worker


def seen_workers(conn: redis.Redis, queue: str | None = None) -> list[Worker]:
    """The workers registered (for ``queue``, or all of them) whose hash still exists."""
    return SeenWorker.all(connection=conn, queue=Queue(queue, connection=conn) if queue else None)


def beating(worker: Worker, ttl: float, now: float | None = None) -> bool:
    """Whether ``worker`` was heard from in the last ``ttl`` seconds (a killed worker's hash
    lingers until its own TTL; its last heartbeat tells)."""
    now = time.time() if now is None else now
    beat = worker.last_heartbeat.timestamp() if worker.last_heartbeat else 0.0
    return now - beat <= ttl
