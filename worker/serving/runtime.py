"""What a worker keeps from job to job: settings, warm pipelines, the batch sizes that fitted in
memory and the models it failed to load. One per worker process, made by ``worker run`` (or
the group leader) and handed to each job inside its :class:`~worker.serving.context.JobContext`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from common.lanes import MADE_BY_WORKER
from common.settings import Settings
from worker.pipelines.backend import GenerationBackend
from worker.pipelines.scores import Scorers
from worker.serving.breaker import Breaker
from worker.serving.metrics import WorkerMetrics


@dataclass
class Runtime:
    settings: Settings
    pipelines: GenerationBackend
    worker_name: str = ""
    #: largest batch that fitted in memory, by (model, width, height), learnt from OOM splits
    batch_limits: dict[tuple[str, int, int], int] = field(default_factory=dict)
    #: models and adapters this worker failed to load (see :mod:`worker.serving.breaker`)
    breaker: Breaker = field(default_factory=Breaker)
    #: this worker's Prometheus series (``--metrics-port``); None: not served
    metrics: WorkerMetrics | None = None
    #: who made this worker's images, in the campaign's ``made-by`` count (``producer status``)
    made_by: str = MADE_BY_WORKER
    #: the reward scorers loaded for jobs that ask for scores (made at the first such job)
    scorers: Scorers | None = None


def worker_name(gpu_label: str) -> str:
    """Names show in rq-dashboard and ``producer status``: GPU first, then host and pid."""
    host = socket.gethostname().split(".")[0]
    label = gpu_label.replace(",", "+")
    label = label if label.startswith("cpu") else f"gpu{label}"
    return f"diffq-{label}-{host}-{os.getpid()}"
