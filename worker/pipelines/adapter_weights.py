"""A LoRA or DoRA read from its file and merged into the UNet's weights without PEFT.

Why: the worker merges adapters into the base weights anyway (:mod:`worker.pipelines.adapters`),
so PEFT's wrapper layers only ever served to compute the merge. Building them is what an
adapter's first job paid: on an H100, ``load_lora_weights`` took 0.98 s for a rank-32 LoRA on
SDXL's 560 attention projections and 1.78 s for a DoRA, all of it Python (6,161 new modules, a
million ``named_modules`` steps, a DoRA weight norm computed on meta tensors and then
overwritten) with the GPU idle, against 0.14-0.25 s for the merge itself
(docs/benchmarks.md, "An adapter's first job"). Read here, an adapter is its tensors and one
scaling per layer; a merge is one matmul per layer, the same arithmetic PEFT's ``merge`` does:

- LoRA: ``W = W0 + s * B @ A`` with ``s = alpha / r`` times the job's adapter scale;
- DoRA: ``V = W0 + s * B @ A``, ``W = m / ||V||_row * V`` (``m`` the magnitude vector).

Only what is unambiguous takes this way: the UNet's ``nn.Linear`` layers, in diffusers' or
PEFT's key names, with no alphas in the file (scaling 1, as diffusers reads such files) or a
saved config of one rank and one alpha. Anything else (text-encoder layers, convolutions,
kohya alphas, rank or alpha patterns, biases) is read by PEFT as before: :func:`read` says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from worker.pipelines.fp8 import StaticFP8Linear

SUFFIXES = {
    ".lora.down.weight": "down",
    ".lora.up.weight": "up",
    ".lora_A.weight": "down",
    ".lora_B.weight": "up",
    ".lora_magnitude_vector": "magnitude",
    ".lora_magnitude_vector.weight": "magnitude",
}


@dataclass(frozen=True)
class LayerDelta:
    """One adapted layer: where it is, its two factors, its scaling, DoRA's magnitude."""

    path: str  # the layer's name in the UNet
    down: torch.Tensor  # A: (r, in_features)
    up: torch.Tensor  # B: (out_features, r)
    scaling: float  # alpha / r (rsLoRA: alpha / sqrt(r)), before the job's adapter scale
    magnitude: torch.Tensor | None  # DoRA: (out_features,)


@dataclass(frozen=True)
class AdapterWeights:
    layers: tuple[LayerDelta, ...]

    @torch.no_grad()
    def merge_into(self, unet: torch.nn.Module, scale: float, remember: Any) -> None:
        """Merge into the layers' current weights, which must be pristine (``remember(layers)`` is
        called first, with all of them at once, to keep a copy). Computed in fp32 and stored in the
        weights' dtype."""
        bases = [_base(unet.get_submodule(layer.path)) for layer in self.layers]
        remember(bases)
        for layer, base in zip(self.layers, bases, strict=True):
            weight = base.weight
            up = layer.up.to(weight.device, torch.float32)
            down = layer.down.to(weight.device, torch.float32)
            merged = weight.float() + (layer.scaling * scale) * (up @ down)
            if layer.magnitude is not None:
                norm = torch.linalg.vector_norm(merged, dim=1)
                merged *= (layer.magnitude.to(weight.device, torch.float32) / norm).unsqueeze(1)
            weight.copy_(merged)


def read(pipe: Any, source: Path, weight_name: str | None) -> AdapterWeights | str:
    """The adapter at ``source`` ready to merge without PEFT, or why it takes PEFT's way."""
    unet = getattr(pipe, "unet", None)
    if not isinstance(unet, torch.nn.Module):
        return "the pipeline has no UNet"
    kwargs: dict[str, Any] = {"return_lora_metadata": True}
    if weight_name:
        kwargs["weight_name"] = weight_name
    state_dict, alphas, metadata = pipe.lora_state_dict(str(source), **kwargs)
    if alphas:
        return "the file gives alphas per layer (kohya's format)"
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        if not key.startswith("unet."):
            return f"it adapts more than the UNet ({key.split('.', 1)[0]})"
        suffix = next((s for s in SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            return f"a tensor this reader does not know ({key})"
        parts.setdefault(key[len("unet.") : -len(suffix)], {})[SUFFIXES[suffix]] = tensor
    if not parts:
        return "no LoRA tensors in the file"
    if len({"magnitude" in found for found in parts.values()}) > 1:
        return "some layers have DoRA's magnitude and some do not"
    alpha_of = _alpha(metadata, dora=any("magnitude" in found for found in parts.values()))
    if isinstance(alpha_of, str):
        return alpha_of
    layers: list[LayerDelta] = []  # on the host until all are read; then moved together
    for path, found in sorted(parts.items()):
        if "down" not in found or "up" not in found:
            return f"layer {path} lacks one of its two factors"
        try:
            module = _base(unet.get_submodule(path))
        except AttributeError:
            return f"no layer {path} in this UNet"
        down, up, magnitude = found["down"], found["up"], found.get("magnitude")
        rank = down.shape[0]
        if type(module) not in (torch.nn.Linear, StaticFP8Linear):  # FP8 layers keep a fp16 weight to merge into
            return f"layer {path} is a {type(module).__name__}, not a Linear"
        shapes_fit = down.shape == (rank, module.in_features) and up.shape == (module.out_features, rank)
        if not shapes_fit or (magnitude is not None and magnitude.shape != (module.out_features,)):
            return f"layer {path}: the tensors' shapes do not fit the layer"
        alpha, rslora = alpha_of(rank)
        if alpha is None:
            return f"layer {path}: rank {rank} is not the saved config's"
        scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
        layers.append(LayerDelta(path, down, up, scaling, magnitude))
    device, dtype = module.weight.device, module.weight.dtype  # the adapted layers'
    factors = iter(moved([t for layer in layers for t in (layer.down, layer.up)], device, dtype))
    magnitudes = iter(moved([m.magnitude for m in layers if m.magnitude is not None], device, torch.float32))
    return AdapterWeights(
        tuple(
            replace(
                layer,
                down=next(factors),
                up=next(factors),
                magnitude=None if layer.magnitude is None else next(magnitudes),
            )
            for layer in layers
        )
    )


def moved(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` on ``device`` in ``dtype``, as views of one buffer. Each crosses alone, in its
    own dtype, and the concatenation and the cast run on the device: nothing big on the host. A
    186 MB ``torch.cat`` on the host (a LoRA's 1,120 fp32 tensors) took 0.18 s alone and 1.4-1.7 s
    while the PNG writer thread encoded the job before's images (one H100 host,
    ``bench/adapter_load.py --beside-writer 8``), which is where a worker's next job starts."""
    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1).to(device) for t in tensors]).to(dtype)
    pieces = flat.split([t.numel() for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(pieces, tensors, strict=True)]


def _alpha(metadata: dict[str, Any] | None, dora: bool) -> Any:
    """From the config saved with the adapter (diffusers writes PEFT's LoraConfig as ``unet.r``,
    ``unet.lora_alpha``...), a function of a layer's rank giving (alpha, rsLoRA), or why the
    config asks for more than this reader does; without a config, alpha is the rank (scaling 1)."""
    config = {k.removeprefix("unet."): v for k, v in (metadata or {}).items() if k.startswith("unet.")}
    if not config:
        return lambda rank: (rank, False)
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        return "the saved config has rank or alpha patterns"
    if config.get("lora_bias") or config.get("bias", "none") != "none" or config.get("modules_to_save"):
        return "the saved config adds biases or whole modules"
    if bool(config.get("use_dora")) != dora:
        return "the saved config and the tensors disagree on DoRA"
    r, alpha, rslora = int(config.get("r", 0)), float(config.get("lora_alpha", 0)), bool(config.get("use_rslora"))
    return lambda rank: (alpha, rslora) if rank == r else (None, rslora)


def _base(module: torch.nn.Module) -> torch.nn.Module:
    """The layer itself, where PEFT has wrapped it for another adapter."""
    get_base_layer = getattr(module, "get_base_layer", None)
    return get_base_layer() if callable(get_base_layer) else module
