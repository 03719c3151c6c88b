"""SDXL (and the SDXL-architecture fine-tunes: Playground v2.5, Pony, Juggernaut, the Lightning
and Turbo UNets): a UNet over 4-channel latents, two CLIP text encoders, CFG as a second half
of the batch. Every speed lever was written for it first."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from common.jobspec import GenParams
from common.presets import AUTO_SPEEDUPS, SPEEDUP_LEVERS
from worker.pipelines import empty_negative, models
from worker.pipelines.families import Family
from worker.pipelines.noise import sdxl_latents
from worker.pipelines.pixels import BatchResult, decode, sampling, sync, to_pil

log = logging.getLogger("diffq.worker")


def run(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None = None,
) -> BatchResult:
    """Prompts encoded once for the batch (an empty negative is SDXL's zero embedding), denoised
    to latents, decoded here (an fp16 VAE that overflows gets the batch again in fp32)."""
    device = pipe._execution_device
    cfg = params.guidance > 1.0
    started = time.perf_counter()
    embeds, neg_embeds, pooled, neg_pooled = pipe.encode_prompt(
        prompt=prompts,
        device=device,
        num_images_per_prompt=1,
        do_classifier_free_guidance=cfg,
        negative_prompt=negatives if any(negatives) else None,
    )
    sync(device)
    encoded = time.perf_counter()
    args = sampling(params, seeds, on_step)
    # the same generators go in too: their states have moved on as diffusers' own draw moves them
    noise = sdxl_latents(pipe, params.width, params.height, args["generator"], embeds.dtype, device)
    latents = pipe(
        prompt_embeds=embeds,
        negative_prompt_embeds=neg_embeds,
        pooled_prompt_embeds=pooled,
        negative_pooled_prompt_embeds=neg_pooled,
        # an empty negative's rows skip cross-attention where the empty-negative lever is on
        cross_attention_kwargs=empty_negative.kwargs(pipe, negatives, cfg, len(prompts)),
        **args,
        latents=noise,
        output_type="latent",
    ).images
    sync(device)
    denoised = time.perf_counter()
    images = to_pil(pipe.image_processor, decode(pipe, latents))
    finished = time.perf_counter()
    return BatchResult(
        images=images, encode_s=encoded - started, denoise_s=denoised - encoded, decode_s=finished - denoised
    )


def _sdxl_random(device: torch.device, dtype: torch.dtype, _cache_dir: str) -> Any:
    try:
        return models.sdxl_random(device, dtype)
    except torch.OutOfMemoryError as exc:
        exc.__traceback__ = None  # its frames hold the half-built model
    gc.collect()
    torch.cuda.empty_cache()
    log.info("sdxl-random: drawing its weights in fp32 does not fit; drawing them in %s", dtype)
    return models.sdxl_random(device, dtype, drawn_in_dtype=True)


FAMILY = Family(
    title="SDXL",
    pipelines=("StableDiffusionXLPipeline",),
    run=run,
    denoiser="unet",
    levers=frozenset(SPEEDUP_LEVERS) | {"fp8"},
    auto=AUTO_SPEEDUPS["sdxl"],
    splits=frozenset({"cfg", "data"}),
    presets={
        "tiny": lambda _device, _dtype, cache_dir: models.ensure_tiny(cache_dir),
        "sdxl-random": _sdxl_random,
    },
)
