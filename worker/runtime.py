"""What a running job can reach of the worker that runs it: settings, warm pipelines, and a
keep-alive hook for heartbeats.

RQ calls our task as a plain function, so the worker installs this before its first job.
A task run by some other RQ worker (``rq worker`` with our queue) still works: it gets a
runtime built from the environment, without heartbeats from inside the job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from common.settings import Settings
from worker.pipelines import PipelineCache


def _nothing() -> None:
    return None


@dataclass
class Runtime:
    settings: Settings
    pipelines: PipelineCache
    keepalive: Callable[[], None] = field(default=_nothing)
    worker_name: str = ""
    #: largest batch that fitted in memory, by (model, width, height), learnt from OOM splits
    batch_limits: dict[tuple[str, int, int], int] = field(default_factory=dict)


_current: Runtime | None = None


def install(runtime: Runtime) -> Runtime:
    global _current
    _current = runtime
    return runtime


def current() -> Runtime:
    if _current is None:
        settings = Settings.load()
        install(
            Runtime(settings, PipelineCache(settings.cache_dir, settings.device, settings.dtype, settings.speedups))
        )
    assert _current is not None
    return _current
