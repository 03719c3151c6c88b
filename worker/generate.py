"""Running one chunk through a warm SDXL pipeline as a single batch.

Prompts are encoded once for the whole batch; each image gets its own CPU generator seeded
with its own seed, so an image depends only on its row (not on its batch-mates, nor on the
GPU it ran on) and a retried or split batch reproduces it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from common.jobspec import GenParams


@dataclass
class BatchResult:
    images: list[Image.Image]
    encode_s: float
    denoise_s: float
    decode_s: float


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_batch(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None = None,
) -> BatchResult:
    device = pipe._execution_device
    cfg = params.guidance > 1.0

    # 1. Encode the prompts once for the batch (empty negatives -> SDXL's zero embedding)
    started = time.perf_counter()
    negative = negatives if any(negatives) else None
    embeds, neg_embeds, pooled, neg_pooled = pipe.encode_prompt(
        prompt=prompts,
        device=device,
        num_images_per_prompt=1,
        do_classifier_free_guidance=cfg,
        negative_prompt=negative,
    )
    _sync(device)
    encoded = time.perf_counter()

    # 2. Denoise, reporting each step; remember when the last one ended
    last_step = [encoded]

    def callback(_pipe: Any, step: int, _timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if step + 1 == params.steps:
            _sync(device)
            last_step[0] = time.perf_counter()
        if on_step:
            on_step(step + 1, params.steps)
        return kwargs

    # 3. Decode (inside the pipeline call, after the last step)
    generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
    images = pipe(
        prompt_embeds=embeds,
        negative_prompt_embeds=neg_embeds,
        pooled_prompt_embeds=pooled,
        negative_pooled_prompt_embeds=neg_pooled,
        width=params.width,
        height=params.height,
        num_inference_steps=params.steps,
        guidance_scale=params.guidance,
        generator=generators,
        callback_on_step_end=callback,
        output_type="pil",
    ).images
    finished = time.perf_counter()
    return BatchResult(
        images=images,
        encode_s=encoded - started,
        denoise_s=last_step[0] - encoded,
        decode_s=finished - last_step[0],
    )
