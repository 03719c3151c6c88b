"""The FP8 GEMM of :class:`worker.pipelines.fp8.StaticFP8Linear`: ``torch._scaled_mm`` on CUDA,
a reference in fp32 elsewhere, and an FP8 output that saturates whatever the backend does.

Why a reference off CUDA: a CPU has no FP8 units, and torch's CPU kernel for ``_scaled_mm`` is
not a contract. On an Intel Xeon with AVX-512 FP16 and AMX (torch 2.13) it was a slow path (a
forward of the tests' tiny UNet did not finish in 20 minutes) and it turned 4,081 of 4,082
outputs past ±448 into NaN where cuBLASLt saturates them. :func:`reference` computes what the
GPU's GEMM computes (FP8 operands, exact fp32 products, fp32 sums, the scales and the bias
applied in fp32, one cast at the end) by dequantizing and multiplying in fp32: the same numbers
on every CPU, at the speed of an fp32 matmul.

Why saturate by hand: a linear that writes its output in FP8 (a GEGLU's input, at a calibrated
scale) relies on what overshoots that scale ending at ±448; a backend that writes NaN instead
makes black or noise images. An E4M3 NaN keeps its sign bit (``S.1111.111``), so
:func:`saturate` turns each NaN byte into the largest finite value of its sign, one byte-wise
select that the compiler fuses into the kernel that reads the output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
#: an E4M3 byte with every exponent and mantissa bit set is NaN (either sign)
_NAN_BITS = 0x7F

#: ``gemm(a, b, scale_a, scale_b, bias, out_dtype, fast_accum)`` by device type; any device not
#: named runs :func:`reference`. A test swaps one in to stand for a backend that misbehaves.
Gemm = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.dtype, bool], torch.Tensor
]


def cuda_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast_accum: bool,
) -> torch.Tensor:
    """cuBLASLt's FP8 GEMM (Ada and Hopper tensor cores)."""
    return torch._scaled_mm(
        a, b, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=out_dtype, use_fast_accum=fast_accum
    )


def reference(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """What ``torch._scaled_mm`` computes, in fp32 on the FP8 values: ``(a @ b) * scale_a *
    scale_b + bias``, saturated at ±448 when written in FP8. Scales are one number each, or one
    per row of ``a`` (``[M, 1]``) and per column of ``b`` (``[1, N]``). ``fast_accum`` changes
    nothing here: fp32 sums are what the GPU's promoted accumulation computes."""
    out = (a.float() @ b.float()) * scale_a.float() * scale_b.float()
    if bias is not None:
        out = out + bias.float()
    if out_dtype == E4M3:
        out = out.clamp(-E4M3_MAX, E4M3_MAX)
    return out.to(out_dtype)


BACKENDS: dict[str, Gemm] = {"cuda": cuda_gemm}


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``a @ b`` of two FP8 operands, scaled, on ``a``'s device's backend (:data:`BACKENDS`); an
    FP8 output is saturated (:func:`saturate`) whatever that backend wrote past ±448."""
    gemm = BACKENDS.get(a.device.type, reference)
    out = gemm(a, b, scale_a, scale_b, bias, out_dtype, fast_accum)
    return saturate(out) if out_dtype == E4M3 else out


def saturate(out: torch.Tensor) -> torch.Tensor:
    """``out`` (E4M3) with each NaN byte made ±448 by its sign bit, every other byte as it was."""
    bits = out.view(torch.uint8)
    return torch.where((bits & _NAN_BITS) == _NAN_BITS, bits - 1, bits).view(E4M3)
