"""Running one chunk through a warm SDXL pipeline as a single batch.

Prompts are encoded once for the whole batch; each image gets its own CPU generator seeded
with its own seed, so an image depends only on its row (not on its batch-mates, nor on the
GPU it ran on) and a retried or split batch reproduces it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from common.errors import OutOfMemory, PermanentJobError
from common.jobspec import GenParams
from worker.pipelines import empty_negative, samplers

log = logging.getLogger("diffq.worker")


class NonFinitePixels(PermanentJobError):
    """A batch decoded to pixels holding NaN or infinity: written, they would be black or noise
    images. Nothing of the batch is written; an FP8 worker runs it again without FP8
    (``WarmPipelines.generate``), any other fails the job (its seeds would give the same again)."""


@dataclass
class BatchResult:
    images: list[Image.Image]
    encode_s: float
    denoise_s: float
    decode_s: float
    #: graphs torch.compile built during this call (0 on a warm worker)
    compiles: int = 0
    #: the most images one pipeline call ran (what fitted in memory, or the chunk if smaller)
    batch: int = 0
    #: where the weights lived (worker/pipelines/offload.py)
    offload: str = ""
    #: the most GPU memory the call's tensors took (0 on the CPU)
    peak_bytes: int = 0
    #: what the denoiser computed in: "fp8" (static-scale FP8 linears) or the weights' dtype
    precision: str = ""


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
    samplers.use(pipe, params.sampler, params.timestep_spacing)  # the job's sampler: no reload, no recompile
    if is_flux(pipe):
        return _run_flux_batch(pipe, params, prompts, seeds, on_step)
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

    # 2. Denoise to latents, reporting each step (an empty negative's rows skip cross-attention
    #    where the empty-negative lever is on)
    def denoise() -> torch.Tensor:
        return pipe(
            prompt_embeds=embeds,
            negative_prompt_embeds=neg_embeds,
            pooled_prompt_embeds=pooled,
            negative_pooled_prompt_embeds=neg_pooled,
            cross_attention_kwargs=empty_negative.kwargs(pipe, negatives, cfg, len(prompts)),
            **_sampling(params, seeds, on_step),
            output_type="latent",
        ).images

    latents = denoise()
    _sync(device)
    denoised = time.perf_counter()

    # 3. Decode; an fp16 VAE that overflows gets this batch again in fp32
    images = to_pil(pipe.image_processor, decode(pipe, latents))
    finished = time.perf_counter()
    return BatchResult(
        images=images,
        encode_s=encoded - started,
        denoise_s=denoised - encoded,
        decode_s=finished - denoised,
    )


def _sampling(params: GenParams, seeds: list[int], on_step: Callable[[int, int], None] | None) -> dict[str, Any]:
    """The pipeline arguments every model takes alike: size, steps, guidance, one CPU generator
    per image (so an image depends on its own seed only), and the step callback."""
    return {
        "width": params.width,
        "height": params.height,
        "num_inference_steps": params.steps,
        "guidance_scale": params.guidance,
        "generator": [torch.Generator("cpu").manual_seed(seed) for seed in seeds],
        "callback_on_step_end": _step_callback(on_step, params.steps),
    }


def _step_callback(on_step: Callable[[int, int], None] | None, steps: int) -> Callable[..., dict[str, Any]]:
    """A diffusers ``callback_on_step_end`` that reports ``(step, steps)`` to ``on_step``."""

    def callback(_pipe: Any, step: int, _timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if on_step:
            on_step(step + 1, steps)
        return kwargs

    return callback


#: a FLUX prompt's T5 tokens, padded to this length (FLUX.1-dev's own): a Ulysses group splits them too
FLUX_TEXT_TOKENS = 512


def is_flux(pipe: Any) -> bool:
    """FLUX pipelines (diffusers' or xDiT's wrapper of one) take no negative prompt and decode themselves."""
    return "Flux" in type(pipe).__name__


def _run_flux_batch(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None,
) -> BatchResult:
    """FLUX.1-dev is guidance-distilled: ``guidance`` is an input of the transformer, not a second
    pass, and there is no negative prompt. Prompts are encoded here and passed as embeddings so
    that xDiT's data parallel does not split the batch a second time.

    Under xDiT only the ranks that hold the result get images; the others get an empty list."""
    device = pipe._execution_device
    started = time.perf_counter()
    embeds, pooled, _text_ids = pipe.encode_prompt(
        prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1, max_sequence_length=FLUX_TEXT_TOKENS
    )
    _sync(device)
    encoded = time.perf_counter()

    with _decode_starts(pipe, device) as decoding:
        out = pipe(
            prompt_embeds=embeds,
            pooled_prompt_embeds=pooled,
            **_sampling(params, seeds, on_step),
            output_type="pt",  # [0, 1] on the device: rounded there, as SDXL's (to_pil)
        )
        _sync(device)
        images = rounded_pil(out.images) if out is not None and out.images is not None else []
    finished = time.perf_counter()
    denoised = decoding[0] if decoding else finished  # a rank that decoded nothing: all of it denoising
    return BatchResult(
        images=images, encode_s=encoded - started, denoise_s=denoised - encoded, decode_s=finished - denoised
    )


@contextmanager
def _decode_starts(pipe: Any, device: torch.device) -> Iterator[list[float]]:
    """Inside: the first ``pipe.vae.decode`` call appends when it starts (the denoise's kernels
    done) to the list given. A FLUX pipeline decodes itself (its latents are packed tokens), so
    the decode is timed at its call; the call is wrapped on the instance, not hooked on the
    decoder module, whose hooks a compiled decoder (``compile-vae``) would trace."""
    vae = getattr(pipe, "vae", None)
    starts: list[float] = []
    if vae is None or "decode" in vae.__dict__:
        yield starts
        return
    method = vae.decode

    def decode(*args: Any, **kwargs: Any) -> Any:
        if not starts:
            _sync(device)
            starts.append(time.perf_counter())
        return method(*args, **kwargs)

    vae.decode = decode
    try:
        yield starts
    finally:
        del vae.decode


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


def unscale(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Latents back to the VAE's space, as ``StableDiffusionXLPipeline.__call__`` does: SDXL
    divides by ``scaling_factor``; checkpoints whose VAE config sets ``latents_mean`` and
    ``latents_std`` (Playground v2.5, for one) also de-normalise per channel."""
    config = vae.config
    mean, std = getattr(config, "latents_mean", None), getattr(config, "latents_std", None)
    if mean is not None and std is not None:
        channels = latents.shape[1]
        mean_t = torch.tensor(mean).view(1, channels, 1, 1).to(latents.device, latents.dtype)
        std_t = torch.tensor(std).view(1, channels, 1, 1).to(latents.device, latents.dtype)
        return latents * std_t / config.scaling_factor + mean_t
    return latents / config.scaling_factor


def to_pil(processor: Any, image: torch.Tensor) -> list[Image.Image]:
    """What ``processor.postprocess(image, output_type="pil")`` gives, pixel for pixel, with the
    0..255 rounding done where the image is. diffusers copies the batch to the host as float32
    and rounds it there: 100 MB and 25 M numpy operations per batch of eight 1024² images, a
    quarter of a second on the worker's one thread (measured: decode 0.65 s per batch against
    0.32 s for the decoder itself). Here 25 MB of bytes cross instead."""
    return rounded_pil(processor.postprocess(image, output_type="pt"))  # denormalized, still on the device


def rounded_pil(image: torch.Tensor) -> list[Image.Image]:
    """A batch of ``[0, 1]`` pixels (``[B, C, H, W]``, on any device) as PIL images, rounded to
    0..255 on that device in float32 as diffusers' ``numpy_to_pil`` rounds on the host: the same
    bytes, a quarter of the bytes copied and no numpy pass over floats. A batch with a pixel that
    is not finite raises :class:`NonFinitePixels` (a cast to bytes would hide it as black)."""
    image = image.float()
    if not bool(torch.isfinite(image).all()):
        raise NonFinitePixels(
            f"the model made non-finite pixels (NaN) in a batch of {image.shape[0]} image(s); nothing of it was "
            "written. Its weights overflow in this dtype: try --dtype float32 or another checkpoint"
        )
    pixels = (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    if pixels.shape[-1] == 1:
        return [Image.fromarray(p.squeeze(-1), mode="L") for p in pixels]
    return [Image.fromarray(p) for p in pixels]


def decode(pipe: Any, latents: torch.Tensor) -> torch.Tensor:
    """The SDXL pipeline's decode, plus a finite check when the VAE runs in fp16 by choice."""
    vae = pipe.vae
    dtype = vae.dtype
    try:  # an OOM in a decode must not leave the VAE in fp32 for the rest of the worker's life
        if dtype == torch.float16 and vae.config.force_upcast:
            vae.to(dtype=torch.float32)
        scaled = unscale(vae, latents.to(next(iter(vae.post_quant_conv.parameters())).dtype))
        image = vae.decode(scaled, return_dict=False)[0]
        if vae.dtype == torch.float16 and not torch.isfinite(image).all():
            log.warning("fp16 VAE decode overflowed; decoding this batch in fp32 (set a fixed VAE or drop vae-fp16)")
            vae.to(dtype=torch.float32)
            image = vae.decode(unscale(vae, latents.float()), return_dict=False)[0]
        return image
    finally:
        if vae.dtype != dtype:
            vae.to(dtype=dtype)
