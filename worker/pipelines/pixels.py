"""What every family's batch shares: the result of a batch, the pipeline arguments every model
takes alike (size, steps, guidance, a CPU generator per image, the step callback), and the way
from a decoder's output to PIL images (rounded on the device, checked finite).

Each family's module (:mod:`worker.pipelines.families`) builds its batch from these.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from common.errors import PermanentJobError
from common.jobspec import GenParams

log = logging.getLogger("diffq.worker")

#: a pipeline's preview decoder for its next batches, where the job asked for one
#: (``--decoder``; :mod:`worker.pipelines.preview`)
PREVIEW_ATTR = "diffq_preview_decoder"


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
    #: each image's reward scores by name (``--score``; worker/pipelines/scores.py), when asked
    scores: list[dict[str, float]] = field(default_factory=list)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sampling(params: GenParams, seeds: list[int], on_step: Callable[[int, int], None] | None) -> dict[str, Any]:
    """The pipeline arguments every model takes alike: size, steps, guidance, one CPU generator
    per image (so an image depends on its own seed only), and the step callback."""
    return {
        "width": params.width,
        "height": params.height,
        "num_inference_steps": params.steps,
        "guidance_scale": params.guidance,
        "generator": [torch.Generator("cpu").manual_seed(seed) for seed in seeds],
        "callback_on_step_end": step_callback(on_step, params.steps),
    }


def step_callback(on_step: Callable[[int, int], None] | None, steps: int) -> Callable[..., dict[str, Any]]:
    """A diffusers ``callback_on_step_end`` that reports ``(step, steps)`` to ``on_step``."""

    def callback(_pipe: Any, step: int, _timestep: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        if on_step:
            on_step(step + 1, steps)
        return kwargs

    return callback


@contextmanager
def decode_starts(pipe: Any, device: torch.device) -> Iterator[list[float]]:
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
            sync(device)
            starts.append(time.perf_counter())
        return method(*args, **kwargs)

    vae.decode = decode
    try:
        yield starts
    finally:
        del vae.decode


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
    # rows of RGB made here, before the copy: a strided host array is copied again by Pillow, on
    # the worker's main thread (tests/test_decode.py)
    pixels = (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu().numpy()
    if pixels.shape[-1] == 1:
        return [Image.fromarray(p.squeeze(-1), mode="L") for p in pixels]
    return [Image.fromarray(p) for p in pixels]


def decode(pipe: Any, latents: torch.Tensor) -> torch.Tensor:
    """The SDXL pipeline's decode, plus a finite check when the VAE runs in fp16 by choice; or
    the job's preview decoder's, which takes the denoiser's latents as they are (scale 1)."""
    preview = getattr(pipe, PREVIEW_ATTR, None)
    if preview is not None:
        image = preview.decode(latents.to(preview.dtype), return_dict=False)[0]
        scale = getattr(pipe, "vae_scale_factor", 8)
        if tuple(image.shape[-2:]) != (latents.shape[-2] * scale, latents.shape[-1] * scale):
            raise PermanentJobError(
                f"the preview decoder makes {image.shape[-1]}x{image.shape[-2]} images where this model's VAE makes "
                f"{latents.shape[-1] * scale}x{latents.shape[-2] * scale}: it is not a decoder of this model's latents"
            )
        return image
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
