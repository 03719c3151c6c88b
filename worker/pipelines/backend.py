"""What the job function needs from whatever makes its images: one process's warm pipelines
(:class:`~worker.pipelines.warm.WarmPipelines`) or an xDiT group spreading each batch over its
ranks (:class:`~worker.group.leader.GroupPipelines`). Both implement this; the job function
(:mod:`worker.serving.task`) knows only this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common.jobspec import GenParams
from worker.pipelines.pixels import BatchResult


@dataclass(frozen=True)
class Batch:
    """One chunk's images to make: the settings they share and, per image, its prompt, negative
    prompt and seed; run in batches of at most ``max_batch`` (what fitted in memory so far)."""

    params: GenParams
    prompts: list[str]
    negatives: list[str]
    seeds: list[int]
    max_batch: int


class GenerationBackend(Protocol):
    device: Any
    dtype: Any
    speedups: Any

    def get(self, model: str, on_progress: Callable[[str | None], None] | None = None) -> tuple[Any, float]:
        """The warm pipeline for ``model`` and the seconds spent loading it now (0 when warm)."""
        ...

    def use_adapters(self, loaded: Any, stack: tuple[tuple[str, float], ...]) -> None:
        """Make these adapters at their weights (or none) active for the next batch."""
        ...

    def use_decoder(self, loaded: Any, name: str | None) -> None:
        """Make this preview decoder (``--decoder``), or the model's VAE (None), decode the next batch."""
        ...

    def generate(
        self,
        loaded: Any,
        batch: Batch,
        on_step: Callable[[int, int], None] | None = None,
        on_progress: Callable[[str | None], None] | None = None,
    ) -> tuple[BatchResult, int]:
        """One chunk's images, in batches of at most ``max_batch``; and the batch size that fitted.
        ``on_progress`` hears about work before the first step (a compile), then None."""
        ...
