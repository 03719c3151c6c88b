"""FLUX.1 (dev, schnell and their fine-tunes): an MMDiT over packed 16-channel latents, CLIP-L
for the pooled text and T5-XXL for the sequence. FLUX.1-dev is guidance-distilled: ``guidance``
is an input of the transformer, not a second pass, and there is no negative prompt."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from common.jobspec import GenParams
from common.presets import AUTO_SPEEDUPS
from worker.pipelines import models
from worker.pipelines.families import Family
from worker.pipelines.pixels import BatchResult, decode_starts, rounded_pil, sampling, sync

DIT_LEVERS = frozenset(
    {"vae-fp16", "compile-blocks", "compile-vae", "fp8", "cuda-graphs", "modulation-once", "fuse-qkv", "encoder-graphs"}
)
#: a FLUX prompt's T5 tokens, padded to this length (FLUX.1-dev's own): a Ulysses group splits them too
TEXT_TOKENS = 512


def run(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None = None,
) -> BatchResult:
    """Prompts encoded here and passed as embeddings, so that xDiT's data parallel does not split
    the batch a second time; the pipeline decodes itself (its latents are packed tokens).

    Under xDiT only the ranks that hold the result get images; the others get an empty list."""
    device = pipe._execution_device
    started = time.perf_counter()
    embeds, pooled, _text_ids = pipe.encode_prompt(
        prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1, max_sequence_length=TEXT_TOKENS
    )
    sync(device)
    encoded = time.perf_counter()
    with decode_starts(pipe, device) as decoding:
        out = pipe(
            prompt_embeds=embeds,
            pooled_prompt_embeds=pooled,
            **sampling(params, seeds, on_step),
            output_type="pt",  # [0, 1] on the device: rounded there, as SDXL's (to_pil)
        )
        sync(device)
        images = rounded_pil(out.images) if out is not None and out.images is not None else []
    finished = time.perf_counter()
    denoised = decoding[0] if decoding else finished  # a rank that decoded nothing: all of it denoising
    return BatchResult(
        images=images, encode_s=encoded - started, denoise_s=denoised - encoded, decode_s=finished - denoised
    )


FAMILY = Family(
    title="FLUX",
    pipelines=("FluxPipeline", "xFuserFluxPipeline"),
    run=run,
    levers=DIT_LEVERS,
    auto=AUTO_SPEEDUPS["flux"],
    own=frozenset({"modulation-once"}),
    splits=frozenset({"data", "ulysses", "ring", "pipefusion", "parallel-vae"}),
    negative_prompt=False,
    presets={
        # bf16 on a GPU: FLUX's weights overflow fp16
        "flux-random": lambda device, dtype, _cache: models.flux_random(
            device, torch.bfloat16 if device.type == "cuda" else dtype
        ),
    },
)
