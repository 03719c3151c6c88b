"""FP8 matmuls with static scales for a denoiser's wide linear layers (``--precision fp8``).

Why static: an FP8 GEMM needs its input in FP8, and a *dynamic* scale (torchao's default: an
amax over every activation on every call) is a reduction and a cast over the whole activation,
both memory-bound; on an H100 it ate most of what the FP8 GEMMs saved (+3.5 % a job,
docs/benchmarks.md). A static scale is one number per layer, measured once by running the fp16
model over a few prompts across the denoising schedule (:func:`calibrate`), so quantizing an
activation is a multiply, a clamp and a cast that the compiler fuses into the op before it.
MLPerf's SDXL submissions quantize the UNet the same way (per-tensor scales calibrated once).

Which layers: linears whose GEMM is wide (both dimensions at least :data:`MIN_FEATURES`) and
long (calibration saw at least :data:`MIN_ROWS` rows per call): SDXL's attention projections,
feed-forward and ``proj_in``/``proj_out``. Not the time embeddings (one row per image) nor
cross-attention's key and value (77 text tokens per image, and all zeros for an empty
negative prompt); those stay in the model's dtype.

GEGLU: the first feed-forward GEMM's output (gate and value, eight times the block's width) is
written in FP8 at a calibrated scale and read back by the activation, which the compiler fuses
with the next linear's quantization; on an H100 one UNet call 181.96 -> 178.82 ms with the
error unchanged (:data:`ACTIVATIONS`). That activation computes GELU in its
tanh form (:data:`FAST_GELU`): its kernel was bound by the exact GELU's ``erf``, and the call went
181.97 -> 175.91 ms.

Convolutions: the denoiser's 3x3 convolutions (a fifth of an SDXL UNet step) run in FP8 too,
through the implicit-GEMM Triton kernel of :mod:`worker.pipelines.fp8_conv` (1.27x cuDNN's fp16
over one UNet call's convolutions on an H100), with static scales the same way; 1x1 and the
few-channel ``conv_in``/``conv_out`` stay in fp16 (:data:`CONVS`).

Adapters: each :class:`StaticFP8Linear` (and :class:`StaticFP8Conv2d`) keeps its fp16
``weight``; adapters merge into that
(worker/pipelines/adapters.py) and :func:`refresh` quantizes the changed weights again (a
cast and one amax per layer, milliseconds), so an adapter switches as fast as without FP8. The
activation scales stay the base model's (a merged adapter moves activations little; what
overshoots saturates at ±448 instead of overflowing).

Scales are kept in ``<cache_dir>/fp8-scales.json`` by model, dtype and the structure levers,
beside the memory profiles, so a host calibrates once per model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worker.pipelines import fp8_conv
from worker.pipelines.fp8_gemm import E4M3, E4M3_MAX, scaled_mm

log = logging.getLogger("diffq.worker")
#: FP8 GEMMs on NVIDIA GPUs need Ada (sm_89) or Hopper (sm_90) tensor cores
FP8_CAPABILITY = (8, 9)
#: a linear narrower than this stays in the model's dtype: its GEMM is too small to gain
MIN_FEATURES = 640
#: nor one that calibration saw called with fewer rows (time embeddings: one row per image)
MIN_ROWS = 1024
#: the 3x3 convolutions in FP8 too (the Triton kernel); False keeps them in fp16, as before it
CONVS = True
#: the feed-forward's first GEMM writes its output (GEGLU's gate and value) in FP8; False: fp16
ACTIVATIONS = True


@dataclass(frozen=True)
class Limits:
    """The smallest layer FP8 takes: ``features`` wide (a convolution half as many channels)
    and called with ``rows`` rows at least. The defaults are what pays on an H100."""

    features: int = MIN_FEATURES
    rows: int = MIN_ROWS


#: the tiny presets' own limits: their layers are 32-64 wide, so the CPU tests and the demo run
#: the FP8 path of a real model (its calibration, kernels and scale files) at a small size
OWN_LIMITS: dict[str, Limits] = {name: Limits(32, 64) for name in ("tiny", "tiny-sd3", "tiny-pixart")}


def limits_for(model: str) -> Limits:
    return OWN_LIMITS.get(model) or Limits(MIN_FEATURES, MIN_ROWS)


#: a scale is never taken from less than this amax (an all-zero calibration input)
MIN_AMAX = 1e-4
#: calibration: prompts, a batch of them at a time, and steps spread over the whole schedule
CALIBRATION_PROMPTS = (
    "a photograph of an astronaut riding a horse on the moon",
    "a watercolor painting of a lighthouse in a storm",
    "close-up portrait of an old fisherman, dramatic light",
    "a bowl of ramen on a wooden table, top view",
    "a futuristic city at night, neon signs, rain",
    "a red fox in a snowy forest",
    "an isometric pixel-art castle",
    "a macro photo of a dew drop on a leaf",
    "a cozy library with tall shelves and a fireplace",
    "a sports car drifting on a mountain road",
    "an oil painting of sunflowers in a vase",
    "a minimalist logo of a mountain and the sun",
    "a crowded market street in Marrakesh",
    "a golden retriever puppy playing in the grass",
    "a cross-section diagram of a volcano",
    "a medieval knight in ornate armor, studio lighting",
)
CALIBRATION_BATCH = 8
#: "tensor" (one weight scale per layer) or "row" (one per output feature, bf16 out of the GEMM);
#: per-tensor measured faster on an H100 (docs/benchmarks.md)
GRANULARITY = "tensor"
CALIBRATION_STEPS = 10
#: the longest reduction whose GEMM accumulates fast: Hopper's tensor cores then keep partial
#: sums in reduced precision instead of promoting them to fp32 every few steps (what Triton's
#: FP8 dot, so the convolution, does by default). On an H100 it took SDXL's UNet call 183.3 ->
#: 180.55 ms at batch 8 with the per-step error unchanged (2.19 % mean); SDXL's longest K is
#: 5120, and the error of a reduced-precision sum grows with K, so longer ones (FLUX's 12288)
#: keep fp32 promotion until measured
FAST_ACCUM_MAX_K = 5120
SCALES_FILE = "fp8-scales.json"
#: bump when what a stored scale means changes (a file of another version is calibrated again);
#: 2: convolutions are calibrated too; 3: and the feed-forward activations' inputs (":out")
SCALES_VERSION = 3
#: a calibrated output's key: the linear's name and this
OUTPUT = ":out"
#: the modules of diffusers whose ``proj`` writes its output in FP8 for the elementwise activation
#: that reads it once: SDXL's GEGLU (gate and value, the widest GEMM output of a block). Only
#: what was measured: FLUX's ``GELU`` would take it the same way, not measured
ACTIVATIONS = ("GEGLU",)
#: GEGLU's GELU in its tanh form (:func:`tanh_gelu`) where its input is written in FP8: the exact
#: GELU's ``erf`` is a long libdevice polynomial per element, and that activation's kernel (read
#: the FP8 gate and value, write the next linear's FP8 input: three bytes an element) is bound
#: by its instructions, not by memory. The two forms differ by at most 4.7e-4 absolute (x near 2.7),
#: against FP8's 1/16 relative rounding of that very output
FAST_GELU = True
#: sqrt(2 / pi) twice: 0.5 * (1 + tanh(z)) is sigmoid(2z)
_TANH_GELU_SCALE = 1.5957691216057308


class StaticFP8Linear(torch.nn.Linear):
    """A linear layer computing in FP8: the input scaled by a calibrated constant and cast, the
    weight cast once (per tensor, or per output row), one FP8 GEMM (:func:`fp8_gemm.scaled_mm`:
    ``torch._scaled_mm`` on CUDA, its fp32 reference elsewhere).

    The layer keeps its original ``weight`` and ``bias`` (adapters merge into the weight);
    ``weight_fp8`` and ``weight_scale`` are buffers updated in place by :meth:`quantize_weight`,
    so a compiled graph, which reads them as inputs, computes with the new values."""

    granularity: str
    #: the GEMM writes FP8 (``output_scale``) and the layer returns it scaled back to the
    #: model's dtype, a multiply the compiler fuses into the activation that reads it
    fp8_output: bool = False
    #: cuBLAS's fast FP8 accumulation (``use_fast_accum``), set by :meth:`replacing` from the
    #: layer's reduction length (:data:`FAST_ACCUM_MAX_K`)
    fast_accum: bool = False
    #: compute with the kept weight in the model's dtype instead (:func:`bypassed`)
    bypass: bool = False

    @classmethod
    def replacing(
        cls, linear: torch.nn.Linear, input_amax: float, granularity: str = "tensor", output_amax: float | None = None
    ) -> StaticFP8Linear:
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.in_features, layer.out_features = linear.in_features, linear.out_features
        layer.weight, layer.bias = linear.weight, linear.bias
        layer.granularity = granularity
        layer.fast_accum = linear.in_features <= FAST_ACCUM_MAX_K
        device = linear.weight.device
        scale = max(float(input_amax), MIN_AMAX) / E4M3_MAX
        layer.register_buffer("input_scale", torch.tensor(scale, dtype=torch.float32, device=device))
        layer.register_buffer("input_inv_scale", torch.tensor(1.0 / scale, dtype=torch.float32, device=device))
        rows = linear.out_features if granularity == "row" else 1
        layer.register_buffer("weight_fp8", torch.empty_like(linear.weight, dtype=E4M3))
        layer.register_buffer("weight_scale", torch.empty((1, rows), dtype=torch.float32, device=device))
        if output_amax is not None and granularity == "tensor":
            layer.fp8_output = True
            out_scale = max(float(output_amax), MIN_AMAX) / E4M3_MAX
            # the output's scale is folded into the input's and the bias (``scale_result`` means
            # a multiply in cuBLAS and a divide in PyTorch's CPU emulation)
            layer.register_buffer("output_scale", torch.tensor(out_scale, dtype=torch.float32, device=device))
            layer.register_buffer("gemm_scale", torch.tensor(scale / out_scale, dtype=torch.float32, device=device))
            if linear.bias is not None:  # cuBLAS adds a bf16 bias to an FP8 output
                layer.register_buffer("gemm_bias", torch.empty_like(linear.bias, dtype=torch.bfloat16))
        layer.quantize_weight()
        return layer

    @torch.no_grad()
    def quantize_weight(self) -> None:
        weight = self.weight.float()
        if self.granularity == "row":
            amax = weight.abs().amax(dim=1).clamp(min=MIN_AMAX)
        else:
            amax = weight.abs().amax().clamp(min=MIN_AMAX).reshape(1)
        scale = amax / E4M3_MAX
        self.weight_fp8.copy_((weight / scale.reshape(-1, 1)).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3))
        self.weight_scale.copy_(scale.reshape(1, -1))
        if self.fp8_output and self.bias is not None:
            self.gemm_bias.copy_(self.bias.float() / self.output_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bypass:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        # row-major whatever the input's layout: cuBLASLt multiplies a row-major FP8 operand only,
        # and a transposed view (a (C, HW) map read as (HW, C) rows at batch 1, or the layout the
        # compiler picks for the cast's buffer) came here without CFG (H200, 2026-12-02)
        quantized = (rows * self.input_inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).contiguous()
        if self.granularity == "row":
            # row-wise scaling wants one scale per row of each operand, and bf16 out
            out = scaled_mm(
                quantized,
                self.weight_fp8.t(),
                scale_a=self.input_scale.expand(rows.shape[0], 1).contiguous(),
                scale_b=self.weight_scale,
                out_dtype=torch.bfloat16,
                fast_accum=self.fast_accum,
            )
            if self.bias is not None:
                out = out + self.bias
            out = out.to(x.dtype)
        elif self.fp8_output:
            out = scaled_mm(  # saturated at ±448 whatever the backend writes past it
                quantized,
                self.weight_fp8.t(),
                scale_a=self.gemm_scale,
                scale_b=self.weight_scale.reshape(()),
                bias=self.gemm_bias if self.bias is not None else None,
                out_dtype=E4M3,
                fast_accum=self.fast_accum,
            )
            out = (out.float() * self.output_scale).to(x.dtype)
        else:
            out = scaled_mm(
                quantized,
                self.weight_fp8.t(),
                scale_a=self.input_scale,
                scale_b=self.weight_scale.reshape(()),
                bias=self.bias,
                out_dtype=x.dtype,
                fast_accum=self.fast_accum,
            )
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8 {self.granularity}, input_scale={float(self.input_scale):.3g}"


class StaticFP8Conv2d(torch.nn.Conv2d):
    """A convolution computing in FP8: the input scaled by a calibrated constant and cast (the
    compiler fuses that into the normalization before it), the weight cast once per tensor into
    the kernel's ``[C_out, KH * KW * C]`` layout, one ``diffq::conv2d_fp8``.

    Like :class:`StaticFP8Linear` it keeps its fp16 ``weight`` for adapters to merge into, and
    ``weight_fp8`` and ``scale`` (the input's scale times the weight's) are buffers updated in
    place by :meth:`quantize_weight`."""

    #: compute with the kept weight in the model's dtype instead (:func:`bypassed`)
    bypass: bool = False

    @classmethod
    def replacing(cls, conv: torch.nn.Conv2d, input_amax: float) -> StaticFP8Conv2d:
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        for attribute in (
            "in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "transposed",
            "output_padding", "groups", "padding_mode", "_reversed_padding_repeated_twice",
        ):  # fmt: skip
            setattr(layer, attribute, getattr(conv, attribute))
        layer.weight, layer.bias = conv.weight, conv.bias
        device = conv.weight.device
        scale = max(float(input_amax), MIN_AMAX) / E4M3_MAX
        layer.register_buffer("input_scale", torch.tensor(scale, dtype=torch.float32, device=device))
        layer.register_buffer("input_inv_scale", torch.tensor(1.0 / scale, dtype=torch.float32, device=device))
        k = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
        layer.register_buffer("weight_fp8", torch.empty((conv.out_channels, k), dtype=E4M3, device=device))
        layer.register_buffer("scale", torch.empty(1, dtype=torch.float32, device=device))
        layer.quantize_weight()
        return layer

    @torch.no_grad()
    def quantize_weight(self) -> None:
        weight = self.weight.float()
        weight_scale = weight.abs().amax().clamp(min=MIN_AMAX) / E4M3_MAX
        matrix = fp8_conv.weight_matrix((weight / weight_scale).clamp(-E4M3_MAX, E4M3_MAX))
        self.weight_fp8.copy_(matrix.to(E4M3))
        self.scale.copy_((weight_scale * self.input_scale).reshape(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bypass:
            return self._conv_forward(x, self.weight, self.bias)
        # The kernel reads channels-last. Asked for here, in the graph, the compiler writes the
        # FP8 input that way from the kernel that computes it; inside the op it was a separate
        # transposing copy (17 ms of a 205 ms UNet call on an H100, docs/benchmarks.md). The
        # output keeps the input's layout, which the normalization after it was built for.
        channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        quantized = (x * self.input_inv_scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
        quantized = quantized.contiguous(memory_format=torch.channels_last)
        kh, kw = self.kernel_size
        return torch.ops.diffq.conv2d_fp8(
            quantized, self.weight_fp8, self.scale, self.bias, kh, kw, self.stride[0], self.padding[0], x.dtype,
            channels_last,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8 tensor, input_scale={float(self.input_scale):.3g}"


def tanh_gelu(gate: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation, ``x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))``: one
    exponential and one reciprocal an element where the compiler's ``erf`` is a polynomial with
    branches (:data:`FAST_GELU`). In fp32: the cube of an fp16 gate above 40 overflows fp16."""
    x = gate.float()
    return (x * torch.sigmoid(_TANH_GELU_SCALE * (x + 0.044715 * x * x * x))).to(gate.dtype)


def denoiser(pipe: Any) -> torch.nn.Module:
    """The model FP8 applies to: SDXL's UNet, or a DiT's transformer (FLUX)."""
    module = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"{type(pipe).__name__} has neither a UNet nor a transformer to quantize")
    return module


def candidate(name: str, module: torch.nn.Module, limits: Limits | None = None) -> bool:
    """A linear worth calibrating: wide enough, shaped for FP8 tensor cores (multiples of 16),
    and not cross-attention's key or value (they read the 77 text tokens)."""
    if type(module) is not torch.nn.Linear:
        return False
    if name.endswith(("attn2.to_k", "attn2.to_v")):
        return False
    dims = (module.in_features, module.out_features)
    least = (limits or Limits(MIN_FEATURES, MIN_ROWS)).features
    return min(dims) >= least and all(d % 16 == 0 for d in dims)


def feeds_activation(name: str, model: torch.nn.Module) -> bool:
    """Whether linear ``name`` is the ``proj`` of an activation module (:data:`ACTIVATIONS`)."""
    parent_name, _, attribute = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    return attribute == "proj" and type(parent).__name__ in ACTIVATIONS


def conv_candidate(module: torch.nn.Module, limits: Limits | None = None) -> bool:
    """A convolution the FP8 kernel takes and that gains from it: 3x3, plain (one group, no
    dilation, zero padding the same on every side), and at least half as many channels as a
    linear needs features (its GEMM is 9 times as deep: SDXL's 320-channel convolutions are its
    longest). 1x1 convolutions measured slower or level with the input's cast counted."""
    if type(module) is not torch.nn.Conv2d or module.kernel_size != (3, 3):
        return False
    if module.groups != 1 or module.dilation != (1, 1) or module.padding_mode != "zeros":
        return False
    if isinstance(module.padding, str) or len(set(module.padding)) != 1 or len(set(module.stride)) != 1:
        return False
    least = (limits or Limits(MIN_FEATURES, MIN_ROWS)).features
    channels = (module.in_channels, module.out_channels)
    return min(channels) >= least // 2 and all(c % 16 == 0 for c in channels)


def quantizable(name: str, module: torch.nn.Module, limits: Limits | None = None) -> bool:
    """A layer :func:`calibrate` measures: a linear :func:`candidate` or, with :data:`CONVS`, a
    :func:`conv_candidate`."""
    return candidate(name, module, limits) or (CONVS and conv_candidate(module, limits))


@torch.no_grad()
def calibrate(pipe: Any, width: int, height: int, limits: Limits | None = None) -> dict[str, float]:
    """Each candidate linear's largest input magnitude over :data:`CALIBRATION_PROMPTS`, denoised
    in the model's dtype for :data:`CALIBRATION_STEPS` steps (so every part of the schedule is
    seen) at ``width`` x ``height`` with CFG 5. Layers that were called with fewer than
    :data:`MIN_ROWS` rows are left out. A linear that feeds an activation (:func:`feeds_activation`)
    also gets its output's largest magnitude, under its name and :data:`OUTPUT`."""
    model = denoiser(pipe)
    amax: dict[str, float] = {}
    rows: dict[str, int] = {}
    handles = []

    def recorder(name: str) -> Any:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0]
            width = x.shape[1] if isinstance(_module, torch.nn.Conv2d) else x.shape[-1]
            rows[name] = min(rows.get(name, 1 << 62), x.numel() // width)
            amax[name] = max(amax.get(name, 0.0), float(x.detach().abs().amax()))

        return hook

    def output_recorder(name: str) -> Any:
        def hook(_module: torch.nn.Module, _args: Any, out: torch.Tensor) -> None:
            amax[name + OUTPUT] = max(amax.get(name + OUTPUT, 0.0), float(out.detach().abs().amax()))

        return hook

    for name, module in model.named_modules():
        if quantizable(name, module, limits):
            handles.append(module.register_forward_pre_hook(recorder(name)))
            if candidate(name, module, limits) and feeds_activation(name, model):
                handles.append(module.register_forward_hook(output_recorder(name)))
    try:
        prompts = list(CALIBRATION_PROMPTS)
        for start in range(0, len(prompts), CALIBRATION_BATCH):
            batch = prompts[start : start + CALIBRATION_BATCH]
            pipe(
                prompt=batch,
                width=width,
                height=height,
                num_inference_steps=CALIBRATION_STEPS,
                guidance_scale=5.0,
                generator=[torch.Generator("cpu").manual_seed(i) for i in range(start, start + len(batch))],
                output_type="latent",
            )
    finally:
        for handle in handles:
            handle.remove()
    least = (limits or Limits(MIN_FEATURES, MIN_ROWS)).rows
    return {name: value for name, value in amax.items() if rows[name.removesuffix(OUTPUT)] >= least}


def quantize(pipe: Any, scales: dict[str, float], granularity: str = "tensor", limits: Limits | None = None) -> int:
    """Replace each calibrated linear by a :class:`StaticFP8Linear` and each calibrated
    convolution by a :class:`StaticFP8Conv2d` (with :data:`CONVS`); returns how many. A linear
    with a calibrated output writes it in FP8 (with :data:`ACTIVATIONS`)."""
    model = denoiser(pipe)
    convs = CONVS
    outputs = ACTIVATIONS and granularity == "tensor"
    device = next(model.parameters()).device
    if convs and not fp8_conv.available(device):
        log.warning("fp8: Triton is not installed, so the convolutions stay fp16 (pip install triton)")
        convs = False
    replaced = 0
    for name, module in list(model.named_modules()):
        if name not in scales:
            continue
        if candidate(name, module, limits):
            output = scales.get(name + OUTPUT) if outputs else None
            layer: torch.nn.Module = StaticFP8Linear.replacing(module, scales[name], granularity, output)
        elif convs and conv_candidate(module, limits):
            layer = StaticFP8Conv2d.replacing(module, scales[name])
        else:
            continue
        parent_name, _, attribute = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attribute, layer)
        if getattr(layer, "fp8_output", False) and FAST_GELU and type(parent).__name__ == "GEGLU":
            parent.gelu = tanh_gelu  # the instance's, over GEGLU.gelu
        replaced += 1
    return replaced


def layers(pipe: Any) -> Iterator[StaticFP8Linear | StaticFP8Conv2d]:
    yield from (m for m in denoiser(pipe).modules() if isinstance(m, (StaticFP8Linear, StaticFP8Conv2d)))


@contextmanager
def bypassed(pipe: Any) -> Iterator[None]:
    """Inside, every FP8 layer of ``pipe`` computes in the model's dtype with its kept weight:
    a batch whose FP8 images came out with non-finite pixels runs again this way (eagerly: the
    caller turns compiled graphs off, which read the flag once, when they were traced)."""
    found = list(layers(pipe))
    fast = [m for m in denoiser(pipe).modules() if m.__dict__.get("gelu") is tanh_gelu]
    for layer in found:
        layer.bypass = True
    for module in fast:  # the model's own GELU, as without FP8
        del module.gelu
    try:
        yield
    finally:
        for layer in found:
            del layer.bypass  # the class's False again
        for module in fast:
            module.gelu = tanh_gelu


def refresh(pipe: Any, changed: Iterable[torch.nn.Module] | None = None) -> int:
    """Quantize FP8 weights again from their fp16 weights (after an adapter was merged or taken
    out); returns how many. ``changed``: the layers whose weights may differ (those an adapter
    ever touched, which :class:`worker.pipelines.adapters.MergedAdapters` keeps); None for all.
    Told, not detected: PEFT merges through ``weight.data``, which no version counter sees. Each
    layer is about ten small kernels, so the 162 of SDXL's 722 FP8 layers no adapter on the
    attention projections touches are worth leaving out."""
    wanted = None if changed is None else {id(m) for m in changed}
    count = 0
    for layer in layers(pipe):
        if wanted is None or id(layer) in wanted:
            layer.quantize_weight()
            count += 1
    return count


def scales_key(model: str, dtype: torch.dtype, structure: str, width: int, height: int) -> str:
    """What a stored calibration depends on: the model, the dtype it ran in, the layers' names
    (``fuse-qkv`` renames them) and the size it was calibrated at."""
    text = json.dumps([SCALES_VERSION, model, str(dtype), structure, width, height])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def structure(pipe: Any) -> str:
    """The layers a calibration measures: the linears' names, and the convolutions' with
    :data:`CONVS` (a calibration without them must not serve a worker that wants them)."""
    kinds = (torch.nn.Linear, torch.nn.Conv2d) if CONVS else (torch.nn.Linear,)
    names = "\n".join(n for n, m in denoiser(pipe).named_modules() if isinstance(m, kinds))
    return hashlib.sha256(names.encode()).hexdigest()[:16]


class ScaleStore:
    """Calibrated scales by :func:`scales_key`, in one JSON file the host's workers share
    (written whole: a temporary file renamed over it)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / SCALES_FILE

    def get(self, key: str) -> dict[str, float] | None:
        try:
            entry = json.loads(self.path.read_text()).get(key)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("fp8: scales %s unreadable (%s); calibrating again", self.path, exc)
            return None
        return {str(k): float(v) for k, v in entry["scales"].items()} if entry else None

    def put(self, key: str, model: str, scales: dict[str, float]) -> None:
        try:
            data = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            data = {}
        data[key] = {"model": model, "at": time.time(), "scales": scales}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=self.path.parent, prefix=".fp8-scales.")
            with os.fdopen(fd, "w") as out:
                json.dump(data, out, indent=1, sort_keys=True)
            os.replace(temp, self.path)
        except OSError as exc:  # the worker runs; only the next one calibrates again
            log.warning("fp8: scales not saved to %s: %s", self.path, exc)


def scales(pipe: Any, model: str, store: ScaleStore | None) -> tuple[dict[str, float], str]:
    """The host's calibration of ``pipe`` (from ``store``), or a new one, kept there; and where
    it came from, for the log ("loaded", "calibrated in 6.1s")."""
    started = time.perf_counter()
    width = height = int(getattr(pipe, "default_sample_size", 128) * getattr(pipe, "vae_scale_factor", 8))
    key = scales_key(model, denoiser(pipe).dtype, structure(pipe), width, height)
    found = store.get(key) if store is not None else None
    if found is not None:
        return found, "loaded"
    log.info(
        "fp8: calibrating %s (%d prompts, %d steps, %dx%d)",
        model,
        len(CALIBRATION_PROMPTS),
        CALIBRATION_STEPS,
        width,
        height,
    )
    found = calibrate(pipe, width, height, limits_for(model))
    if store is not None:
        store.put(key, model, found)
    return found, f"calibrated in {time.perf_counter() - started:.1f}s"


def apply(pipe: Any, model: str, store: ScaleStore | None, granularity: str = "tensor") -> float:
    """Calibrate (or load the host's calibration) and quantize; returns the seconds spent."""
    started = time.perf_counter()
    found, source = scales(pipe, model, store)
    quantize(pipe, found, granularity, limits_for(model))
    quantized = list(layers(pipe))
    linears = [layer for layer in quantized if isinstance(layer, StaticFP8Linear)]
    log.info(
        "fp8: %d linear layer(s) (%d accumulating fast, %d writing FP8) and %d convolution(s) in FP8 with static "
        "per-%s scales (%s)",
        len(linears),
        sum(layer.fast_accum for layer in linears),
        sum(layer.fp8_output for layer in linears),
        len(quantized) - len(linears),
        granularity,
        source,
    )
    return time.perf_counter() - started
