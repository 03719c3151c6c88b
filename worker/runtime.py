"""What a running job can reach of the worker that runs it: settings, warm pipelines, and the
batch sizes that fitted in memory (heartbeats come from the worker's keeper thread).

RQ calls our task as a plain function, so the worker installs this before its first job.
A task run by some other RQ worker (``rq worker`` with our queue) still works: it gets a
runtime built from the environment, and no diffq heartbeats or dead-worker recovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.settings import Settings
from worker.breaker import Breaker
from worker.pipelines import PipelineCache


@dataclass
class Runtime:
    settings: Settings
    pipelines: PipelineCache
    worker_name: str = ""
    #: largest batch that fitted in memory, by (model, width, height), learnt from OOM splits
    batch_limits: dict[tuple[str, int, int], int] = field(default_factory=dict)
    #: models and adapters this worker failed to load (see :mod:`worker.breaker`)
    breaker: Breaker = field(default_factory=Breaker)
    #: the running job's entry in RQ's started registry (``<job id>:<execution id>``), set by the
    #: diffq worker before each job: recording is fenced on it (see :mod:`common.ledger`)
    execution: str | None = None


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
