"""Is a worker on this host alive? The answer a container's healthcheck wants, read from what
the worker already writes: its RQ worker hash, whose heartbeat the keeper renews every sixth of
``DIFFQ_HEARTBEAT_TTL`` whether the worker is busy, idle or paused. A process that hangs stops
renewing it; one that died leaves no live hash. No file, no port: the worker does nothing more
for its healthcheck than it does for ``producer status``."""

from __future__ import annotations

import socket

import redis

from common.heartbeats import beating, seen_workers


def live_workers_here(conn: redis.Redis, hostname: str, ttl: float) -> list[str]:
    """Names of the workers registered from ``hostname`` whose last heartbeat is within ``ttl``."""
    return [worker.name for worker in seen_workers(conn) if worker.hostname == hostname and beating(worker, ttl)]


def this_host() -> str:
    return socket.gethostname()
