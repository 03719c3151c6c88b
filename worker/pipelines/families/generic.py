"""Any other text-to-image pipeline of diffusers (``common/families.py``: Sana, HunyuanDiT,
Lumina, Kolors' relatives, Stable Diffusion 1.5, ...), run eagerly: the pipeline encodes its
prompts once a call and decodes itself; no speed lever applies (the worker says which it left
out, once). The other families' batches reuse :func:`call` where the pipeline's own call is
already the batch they want."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from common.jobspec import GenParams
from worker.pipelines.families import Family
from worker.pipelines.pixels import BatchResult, decode_starts, rounded_pil, sampling, sync


def _arguments(pipe: Any) -> set[str]:
    return set(inspect.signature(type(pipe).__call__).parameters)


def _step_arguments(pipe: Any, params: GenParams, on_step: Callable[[int, int], None] | None) -> dict[str, Any]:
    """The step callback the way this pipeline takes one: ``callback_on_step_end`` (diffusers'
    current way), or the older ``callback``/``callback_steps`` (PixArt's)."""
    taken = _arguments(pipe)
    if "callback_on_step_end" in taken or on_step is None:
        return {}
    if "callback" in taken:
        return {"callback": lambda step, _t, _latents: on_step(step + 1, params.steps), "callback_steps": 1}
    return {}


def call(
    pipe: Any,
    params: GenParams,
    prompts: list[str],
    negatives: list[str],
    seeds: list[int],
    on_step: Callable[[int, int], None] | None = None,
    **extra: Any,
) -> BatchResult:
    """One pipeline call for the batch with the prompts as text; the encode is timed where the
    pipeline calls its ``encode_prompt``, the decode where it calls its VAE's ``decode``."""
    device = pipe._execution_device
    taken = _arguments(pipe)
    kwargs = {k: v for k, v in sampling(params, seeds, on_step).items() if k in taken}
    kwargs |= _step_arguments(pipe, params, on_step)
    if any(negatives) and "negative_prompt" in taken:
        kwargs["negative_prompt"] = negatives
    encoded: list[float] = []
    own_encode = getattr(pipe, "encode_prompt", None)
    if own_encode is not None and "encode_prompt" not in pipe.__dict__:

        def encode_prompt(*args: Any, **kw: Any) -> Any:
            out = own_encode(*args, **kw)
            if not encoded:
                sync(device)
                encoded.append(time.perf_counter())
            return out

        pipe.encode_prompt = encode_prompt
    started = time.perf_counter()
    try:
        with decode_starts(pipe, device) as decoding:
            out = pipe(prompt=prompts, **kwargs, **extra, output_type="pt")
            sync(device)
            images = rounded_pil(out.images) if out is not None and out.images is not None else []
    finally:
        pipe.__dict__.pop("encode_prompt", None)
    finished = time.perf_counter()
    encode_end = encoded[0] if encoded else started
    denoised = decoding[0] if decoding else finished
    return BatchResult(
        images=images, encode_s=encode_end - started, denoise_s=denoised - encode_end, decode_s=finished - denoised
    )


FAMILY = Family(title="a diffusers pipeline", pipelines=(), run=call)
