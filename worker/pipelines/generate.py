"""Running one chunk through a warm pipeline as a single batch, whatever its family.

Prompts are encoded once for the whole batch; each image gets its own CPU generator seeded
with its own seed, so an image depends only on its row (not on its batch-mates, nor on the
GPU it ran on) and a retried or split batch reproduces it. How a family's batch runs is its
module's (:mod:`worker.pipelines.families`); what this module adds is the job's sampler and the
split of a batch that does not fit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image

from common.errors import OutOfMemory
from common.jobspec import GenParams
from worker.pipelines import samplers
from worker.pipelines.families import family_of
from worker.pipelines.pixels import BatchResult

log = logging.getLogger("diffq.worker")


@torch.inference_mode()
def run_batch(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None = None,
) -> BatchResult:
    samplers.use(pipe, params.sampler, params.timestep_spacing)  # the job's sampler: no reload, no recompile
    return family_of(pipe).run(pipe, params, prompts, negatives, seeds, on_step)


def is_oom(exc: BaseException) -> bool:
    """CUDA's out-of-memory, whichever way this torch version spells it."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
    )


def run_split(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    max_batch: int,
    on_step: Callable[[int, int], None] | None = None,
    run: Callable[..., BatchResult] = run_batch,
    pad_to: Callable[[int], int] | None = None,
) -> tuple[BatchResult, int]:
    """:func:`run_batch` in batches of at most ``max_batch``, halving a batch that runs out of
    memory until one image at a time; returns the merged result and the batch size that fit.

    ``pad_to(n)`` is the batch size to run ``n`` images at: a compiled worker's graphs are
    static, so a short batch (a tail chunk) is padded with copies of its last row up to a size
    that has a graph, and the extra images are dropped. Never past the size that fits: after an
    out-of-memory split, parts are padded up to the half that fit (one new graph, not one per part).

    Seeds are per image, so a split or padded batch gives the same images as the whole one would.
    """
    parts = [list(range(i, min(i + max_batch, len(prompts)))) for i in range(0, len(prompts), max_batch)]
    images: dict[int, Image.Image] = {}
    total = BatchResult([], 0.0, 0.0, 0.0)
    fitted = max_batch
    while parts:
        part = parts.pop(0)
        size = max(len(part), min(pad_to(len(part)), fitted)) if pad_to is not None else len(part)
        rows = part + [part[-1]] * (size - len(part))
        try:
            result = run(
                pipe,
                params,
                prompts=[prompts[i] for i in rows],
                negatives=[negatives[i] for i in rows],
                seeds=[seeds[i] for i in rows],
                on_step=on_step,
            )
        except Exception as exc:
            if not is_oom(exc):
                raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if len(part) == 1:
                raise OutOfMemory(
                    f"out of memory even for one {params.width}x{params.height} image with {params.model!r}: "
                    "use a smaller size or a GPU with more memory"
                ) from None
            half = (len(part) + 1) // 2
            fitted = min(fitted, half)
            log.warning("out of memory at batch %d; splitting into %d + %d", len(part), half, len(part) - half)
            parts[:0] = [part[:half], part[half:]]
            continue
        if result.images:  # under xDiT, ranks that do not hold the result get none
            images.update(zip(part, result.images[: len(part)], strict=True))
        total.encode_s += result.encode_s
        total.denoise_s += result.denoise_s
        total.decode_s += result.decode_s
    total.images = [images[i] for i in range(len(prompts))] if images else []
    return total, fitted
