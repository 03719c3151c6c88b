"""Redis connection, the RQ queue, and the few keys diffq keeps beside RQ's own.

RQ's registries (queued, started, finished, failed, scheduled) are the source of truth for
job state. Beside them we keep only what RQ cannot tell us:

- ``diffq:<queue>:items`` — hash: item key → job id while queued, ``done`` once its images are
  written. This is what makes a re-run of the producer add nothing that is queued or done,
  even after RQ has expired the finished job.
- ``diffq:<queue>:images`` — counter of images written.
- ``diffq:<queue>:recent`` — sorted set of recent completions (score: time) for throughput.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from common.settings import redact

TASK_FUNC = "worker.task.run_job"
DONE = "done"
RECENT_WINDOW_S = 600


def connect(url: str, *, check: bool = True) -> redis.Redis:
    """A client for ``url`` (redis://, rediss:// or unix://); credentials come from the URL only."""
    try:
        conn = redis.Redis.from_url(url, socket_connect_timeout=5, health_check_interval=30)
    except ValueError as exc:
        raise ConfigError(f"--redis-url {redact(url)!r}: {exc}") from None
    if check:
        try:
            conn.ping()
        except redis.AuthenticationError:
            raise ConfigError(f"Redis at {redact(url)} refused the credentials in the URL") from None
        except redis.RedisError as exc:
            raise ConfigError(
                f"cannot reach Redis at {redact(url)} ({exc.__class__.__name__}): "
                "start redis-server or set --redis-url / REDIS_URL"
            ) from None
    return conn


def get_queue(name: str, conn: redis.Redis) -> Queue:
    """The RQ queue ``name``, always with the JSON serializer: a job payload can never be pickle."""
    return Queue(name, connection=conn, serializer=JSONSerializer)


def items_key(queue: str) -> str:
    return f"diffq:{queue}:items"


def images_key(queue: str) -> str:
    return f"diffq:{queue}:images"


def recent_key(queue: str) -> str:
    return f"diffq:{queue}:recent"
