"""What a running job can reach of the worker that runs it: settings, warm pipelines, and the
batch sizes that fitted in memory (heartbeats come from the worker's keeper thread).

RQ calls our task as a plain function, so the diffq worker installs this before its first
job (one per process: the worker's pipeline cache is the one piece of global state). A task
run by some other RQ worker (``rq worker`` with our queue) gets a runtime built from the
settings, and says so in its log: it has no diffq heartbeats, no dead-worker recovery and no
fenced recording.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common.settings import Settings
from worker.pipelines.backend import GenerationBackend
from worker.pipelines.cache import PipelineCache
from worker.serving.breaker import Breaker

log = logging.getLogger("diffq.worker")


@dataclass
class Runtime:
    settings: Settings
    pipelines: GenerationBackend
    worker_name: str = ""
    #: largest batch that fitted in memory, by (model, width, height), learnt from OOM splits
    batch_limits: dict[tuple[str, int, int], int] = field(default_factory=dict)
    #: models and adapters this worker failed to load (see :mod:`worker.serving.breaker`)
    breaker: Breaker = field(default_factory=Breaker)
    #: the running job's entry in RQ's started registry (``<job id>:<execution id>``), set by the
    #: diffq worker before each job: recording is fenced on it (see :mod:`common.ledger`)
    execution: str | None = None
    #: set by the diffq worker when overlap is on: takes a job's tail (write and record its
    #: images) for the writer thread and returns what the job function returns instead
    #: (see :mod:`worker.serving.overlap`); None: the job runs its tail itself
    hand_off: Callable[[Callable[[], dict[str, Any]]], Any] | None = None
    #: completes the previous job in RQ if the writer is done with it; called between steps
    pump: Callable[[], None] | None = None


_current: Runtime | None = None


def install(runtime: Runtime) -> Runtime:
    global _current
    _current = runtime
    return runtime


def current() -> Runtime:
    if _current is None:
        settings = Settings.load()
        log.warning(
            "diffq job run by a plain RQ worker: no heartbeats, no recovery of dead workers' jobs, no fenced "
            "recording; run `worker run` for those"
        )
        cache = PipelineCache(settings.cache_dir, settings.device, settings.dtype, settings.speedups)
        install(Runtime(settings, cache))
    assert _current is not None
    return _current
