"""A worker takes the queued jobs of a model it holds warm before those of another.

A campaign over several models (a ``model`` column, or ``--model`` given twice) queues its
jobs in the order of its rows, so a worker that keeps one model warm (an SDXL UNet is 5 GB;
``--max-models`` is 1 unless given) would load a model for every job whose model differs from
the last one's: a 30-60 s load for a 1-8 s job. A worker that keeps several (``--max-models 2``)
prefers the jobs of any of them. Before each dequeue, the worker looks at the
first :data:`PEEK` jobs of each of its queues; when the one at the front is of a model it does
not hold and a later one is of a model it holds, it moves that job to the front, and RQ's own
dequeue takes it. Another worker's jobs are not held back: the job left behind stays at the
front of what remains, for the next worker that takes it (or this one, when nothing of its
model is left).

The move is one Lua step (``LREM`` then ``LPUSH`` of the same id), so a job is always in the
queue exactly once, whatever dies when; a job another worker took meanwhile is simply not
moved. The job's model is read from the job hash RQ stores (its ``data``, the spec's
``params.model``): the producer writes nothing more, and jobs queued before this existed are
ordered too.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Iterable
from typing import Any

import redis
from rq.job import Job

log = logging.getLogger("diffq.worker")

#: how far down a queue the worker looks for a job of a model it holds
PEEK = 32

_TO_FRONT = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


def job_model(data: bytes | None) -> str | None:
    """The model of a job from its hash's ``data`` field (None: not a diffq job, or unreadable)."""
    if not data:
        return None
    try:
        _func, _instance, _args, kwargs = json.loads(zlib.decompress(data))
        model = kwargs["spec"]["params"]["model"]
    except (ValueError, TypeError, KeyError, zlib.error):
        return None
    return model if isinstance(model, str) else None


def prefer_held(conn: redis.Redis, queue_keys: Iterable[str], held: set[str], peek: int = PEEK) -> str | None:
    """Move the first queued job of a held model to the front of its queue when the job at the
    front is of another model. Returns the id moved, or None (nothing held, the front job's
    model is held, or no job of a held model within ``peek``)."""
    if not held:
        return None
    for queue_key in queue_keys:
        front = conn.lindex(queue_key, 0)
        if front is None:
            continue
        if job_model(conn.hget(Job.key_for(front.decode()), "data")) in held:
            return None  # the common case, a campaign of one model: two round trips, nothing more
        ids = conn.lrange(queue_key, 1, peek - 1)
        with conn.pipeline(transaction=False) as pipe:
            for raw in ids:
                pipe.hget(Job.key_for(raw.decode()), "data")
            models = [job_model(data) for data in pipe.execute()]
        for raw, model in zip(ids, models, strict=True):
            if model in held:
                return raw.decode() if conn.eval(_TO_FRONT, 1, queue_key, raw) else None
        return None  # this queue's front is another model's, and so is all we looked at
    return None


def put_held_first(conn: redis.Redis, queues: Iterable[Any], runtime: Any) -> None:
    """:func:`prefer_held` for a worker's queues and the models its pipelines hold (a backend
    without ``held_models``, a group's, holds none here). Ordering only: Redis not answering
    changes nothing, and the dequeue that follows says so itself."""
    held = getattr(runtime.pipelines, "held_models", None) if runtime is not None else None
    if held is None:
        return
    try:
        prefer_held(conn, [queue.key for queue in queues], held())
    except redis.RedisError as exc:
        log.debug("queue order left as it is (%s)", exc)
