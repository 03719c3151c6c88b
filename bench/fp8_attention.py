"""FP8 self-attention in Triton against PyTorch's fp16 attention, on the SDXL UNet's
self-attention shapes at one batch, summed the way one UNet call runs them: measured on an H100
and not taken into the worker (docs/benchmarks.md: 0.91x PyTorch's fp16 over one call's
self-attention, 5.4 % error), kept so the measurement can be run again.

    python bench/fp8_attention.py --out r.jsonl --rows 16      # 16 UNet rows = a batch of 8 with CFG

The kernel is flash attention's online softmax with both products in FP8, the way
FlashAttention-3 and TensorRT's FP8 MHA do it: ``Q @ K^T`` from FP8 query and key with static
per-tensor scales; ``P @ V`` from the unnormalized probabilities ``exp(s - max) <= 1`` times
:data:`P_SCALE` (so small ones stay in FP8's normal range) against FP8 values stored transposed
(``[batch, heads, head_dim, tokens]``: Hopper's FP8 ``wgmma`` reads both operands contiguous
along the reduction); the row sums stay fp32. Query and key are read in place from the
projections' ``[batch, tokens, heads * head_dim]`` rows; the output is written in that layout.
Why it did not pay: at SDXL's head_dim of 64 each score costs 256 FLOPs of matmul against one
exponential, so the softmax, not the tensor cores, bounds both kernels (cuDNN's fp16 reaches 479
TFLOP/s at 4096 tokens). tests/test_py runs the kernel under Triton's interpreter.

For each shape (tokens, heads; head_dim 64): ``F.scaled_dot_product_attention`` in fp16 on the
projections viewed per head (what diffusers' processor calls; the backend PyTorch picks), the
Triton kernel on FP8 inputs, the same kernel on fp16 inputs (how far the kernel itself is from
PyTorch's), and the three casts to FP8 on their own (an upper bound: in a model the compiler
would fuse them into the kernels that write the projections); the output's relative error
against fp16.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from fp8_conv import record, summary, timed  # bench/, this script's own folder

E4M3 = torch.float8_e4m3fn
#: the probabilities are multiplied by this before their cast to FP8 (e4m3's largest is 448): a
#: probability of 2^-14 is then 2^-6, e4m3's smallest normal number, instead of flushing to zero
P_SCALE = 256.0
LOG2_E = 1.4426950408889634


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    shapes = (
        ((16, 16, 1, 1),)  # the interpreter runs each block on the CPU: small ones, one config
        if os.environ.get("TRITON_INTERPRET") == "1"
        else (
            (128, 64, 3, 4),
            (128, 64, 4, 8),
            (128, 128, 3, 8),
            (128, 128, 2, 8),
            (64, 64, 3, 4),
            (64, 128, 3, 4),
        )
    )
    configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_stages=s, num_warps=w) for m, n, s, w in shapes]

    @triton.autotune(configs=configs, key=["HEADS", "SQ", "SK", "HEAD_D"], cache_results=True)
    @triton.jit
    def attention_fp8_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        scale_ptr,
        HEADS,
        SQ,
        SK,
        SQ_B,
        SQ_H,
        SQ_S,
        SK_B,
        SK_H,
        SK_S,
        SV_B,
        SV_H,
        SV_S,
        SV_D,
        SO_B,
        SO_H,
        SO_S,
        HEAD_D: tl.constexpr,
        P_MUL: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        block = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // HEADS
        h = bh % HEADS
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, HEAD_D)
        row_ok = offs_m < SQ
        q = tl.load(
            q_ptr + b * SQ_B + h * SQ_H + offs_m[:, None] * SQ_S + offs_d[None, :], mask=row_ok[:, None], other=0.0
        )
        # scale_ptr: [q_scale * k_scale * log2(e) / sqrt(d), v_scale / P_MUL]
        qk_scale = tl.load(scale_ptr)
        out_scale = tl.load(scale_ptr + 1)
        k_base = k_ptr + b * SK_B + h * SK_H
        v_base = v_ptr + b * SV_B + h * SV_H
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD_D), dtype=tl.float32)
        for start in range(0, SK, BLOCK_N):
            cols = start + offs_n
            col_ok = cols < SK
            k_t = tl.load(k_base + cols[None, :] * SK_S + offs_d[:, None], mask=col_ok[None, :], other=0.0)
            scores = tl.dot(q, k_t) * qk_scale
            scores = tl.where(col_ok[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            p = tl.math.exp2(scores - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + cols[:, None] * SV_S + offs_d[None, :] * SV_D, mask=col_ok[:, None], other=0.0)
            acc = tl.dot((p * P_MUL).to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        acc = acc * (out_scale / l_i)[:, None]
        out_ptrs = out_ptr + b * SO_B + h * SO_H + offs_m[:, None] * SO_S + offs_d[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])

    return attention_fp8_kernel


def scales(q_scale: float, k_scale: float, v_scale: float, head_dim: int, fp8: bool = True) -> list[float]:
    """The kernel's two constants: what multiplies ``Q @ K^T`` (the two tensors' scales, the
    softmax's ``1/sqrt(d)`` and ``log2(e)``, since it exponentiates in base 2) and what multiplies
    ``P @ V`` (the value's scale over :data:`P_SCALE`; 1 where P stays unscaled, off FP8)."""
    p_mul = P_SCALE if fp8 else 1.0
    return [q_scale * k_scale * LOG2_E / math.sqrt(head_dim), v_scale / p_mul]


def empty_output(q: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``[batch, tokens, heads * head_dim]``, unwritten."""
    return torch.empty(q.shape, device=q.device, dtype=out_dtype)


def attention(
    q: torch.Tensor, k: torch.Tensor, v_t: torch.Tensor, scale: torch.Tensor, heads: int, out_dtype: torch.dtype
) -> torch.Tensor:
    """Softmax attention of ``q`` ``[batch, Sq, heads * d]`` over ``k`` ``[batch, Sk, heads * d]``
    and ``v_t`` ``[batch, heads, d, Sk]``, all of one dtype (FP8 on the GPU; any float under the
    interpreter), rows contiguous along ``d`` (``v_t`` along ``Sk``). ``scale``: the two fp32
    constants of :func:`scales`, read on the device so a compiled graph never syncs on them.
    Returns ``[batch, Sq, heads * d]`` in ``out_dtype``."""
    batch, sq, width = q.shape
    sk = k.shape[1]
    head_dim = width // heads
    if width % heads or k.shape != (batch, sk, width) or v_t.shape != (batch, heads, head_dim, sk):
        raise ValueError(
            f"attention shapes q {tuple(q.shape)} k {tuple(k.shape)} v_t {tuple(v_t.shape)}, {heads} heads"
        )
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError("query and key must be contiguous along the head dimension")
    out = empty_output(q, out_dtype)
    launch = _kernel()

    def grid(meta: dict[str, int]) -> tuple[int, int]:
        return (-(-sq // meta["BLOCK_M"]), batch * heads)

    launch[grid](
        q, k, v_t, out, scale, heads, sq, sk,
        q.stride(0), head_dim * q.stride(2), q.stride(1),
        k.stride(0), head_dim * k.stride(2), k.stride(1),
        v_t.stride(0), v_t.stride(1), v_t.stride(3), v_t.stride(2),
        out.stride(0), head_dim, out.stride(1),
        HEAD_D=head_dim,
        P_MUL=P_SCALE if q.dtype == torch.float8_e4m3fn else 1.0,
    )  # fmt: skip
    return out


def reference(
    q: torch.Tensor, k: torch.Tensor, v_t: torch.Tensor, scale: torch.Tensor, heads: int, out_dtype: torch.dtype
) -> torch.Tensor:
    """What :func:`attention` computes, in fp32 on the same (FP8) values by
    ``F.scaled_dot_product_attention``: the CPU's path, where no Triton kernel runs."""
    batch, sq, width = q.shape
    head_dim = width // heads
    qk, out_scale = scale.float()[0], scale.float()[1]
    fp8 = q.dtype == torch.float8_e4m3fn
    # the kernel's constants, undone: scores = q.k * qk / log2(e); out = softmax @ v * out_scale * P_MUL
    qh = q.float().reshape(batch, sq, heads, head_dim).transpose(1, 2)
    kh = k.float().reshape(batch, -1, heads, head_dim).transpose(1, 2)
    vh = v_t.float().transpose(2, 3)
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, scale=float(qk) / LOG2_E)
    out = out * out_scale * (P_SCALE if fp8 else 1.0)
    return out.transpose(1, 2).reshape(batch, sq, width).to(out_dtype)


#: SDXL at 1024²: (tokens, heads, layers): 640 channels at 64x64 (10 transformer layers), 1280 at
#: 32x32 (60); head_dim 64 everywhere
SDXL_SELF_ATTENTION = ((4096, 10, 10), (1024, 20, 60))
HEAD_DIM = 64


def measure(rows: int, tokens: int, heads: int) -> dict:
    width = heads * HEAD_DIM
    q, k, v = (torch.randn(rows, tokens, width, device="cuda", dtype=torch.float16) for _ in range(3))

    def per_head(t: torch.Tensor) -> torch.Tensor:
        return t.view(rows, tokens, heads, HEAD_DIM).transpose(1, 2)

    def fp16() -> torch.Tensor:
        out = F.scaled_dot_product_attention(per_head(q), per_head(k), per_head(v))
        return out.transpose(1, 2).reshape(rows, tokens, width)

    amax = [float(t.abs().amax()) / 448 for t in (q, k, v)]
    inv = [1 / a for a in amax]

    def casts() -> tuple[torch.Tensor, ...]:
        q8 = (q * inv[0]).clamp(-448, 448).to(E4M3)
        k8 = (k * inv[1]).clamp(-448, 448).to(E4M3)
        v8 = (per_head(v) * inv[2]).clamp(-448, 448).to(E4M3).transpose(2, 3).contiguous()
        return q8, k8, v8

    q8, k8, v8 = casts()
    scale8 = torch.tensor(scales(*amax, HEAD_DIM), device="cuda")
    scale16 = torch.tensor(scales(1.0, 1.0, 1.0, HEAD_DIM, fp8=False), device="cuda")
    v16 = per_head(v).transpose(2, 3).contiguous()
    ref = fp16().float()
    got = attention(q8, k8, v8, scale8, heads, torch.float16).float()
    got16 = attention(q, k, v16, scale16, heads, torch.float16).float()
    same = reference(q8, k8, v8, scale8, heads, torch.float32)
    flops = 4 * rows * heads * tokens * tokens * HEAD_DIM
    row = {
        "rel_err": round(float((got - ref).norm() / ref.norm()), 5),
        "kernel_rel_err": round(float((got - same).norm() / same.norm()), 5),
        "fp16_kernel_rel_err": round(float((got16 - ref).norm() / ref.norm()), 6),
        "fp16_ms": round(timed(fp16), 4),
        "fp8_ms": round(timed(lambda: attention(q8, k8, v8, scale8, heads, torch.float16)), 4),
        "fp8_config": str(_kernel().best_config),
        "triton_fp16_ms": round(timed(lambda: attention(q, k, v16, scale16, heads, torch.float16)), 4),
        "cast_ms": round(timed(casts), 4),
    }
    for key in ("fp16", "fp8", "triton_fp16"):
        row[f"{key}_tflops"] = round(flops / row[f"{key}_ms"] / 1e9, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    parser.add_argument("--rows", type=int, default=16, help="UNet rows (batch x 2 with CFG)")
    args = parser.parse_args()
    out = Path(args.out)
    total = {"fp16_ms": 0.0, "fp8_ms": 0.0, "triton_fp16_ms": 0.0, "cast_ms": 0.0}
    for tokens, heads, layers in SDXL_SELF_ATTENTION:
        row = {"label": "fp8attn.shape", "rows": args.rows, "tokens": tokens, "heads": heads, "count": layers}
        row.update(measure(args.rows, tokens, heads))
        for key in total:
            total[key] += row[key] * layers
        record(out, row)
    record(out, summary("fp8attn.unet_call", args.rows, total))


if __name__ == "__main__":
    sys.exit(main())
