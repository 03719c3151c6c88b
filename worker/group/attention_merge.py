"""The ring's last merge of two attentions, as one kernel that writes the model's layout.

A ring rank attends to its own keys and then to each peer's, and merges the softmaxes by their
log-sum-exp in fp32 (:mod:`worker.group.ring_attention`). Written in torch ops, Inductor fuses
that merge into the kernel after the attention: in a FLUX single-stream block the one that
concatenates the attention with the MLP's activations and applies the GELU. Profiled on 2 H200s
(``fluxmodq``, 2026-11-28), that kernel took 0.10 s an image on a ring rank, for half the tokens,
where one GPU's, with no merge in it, took 0.12 s for all of them: the merged kernel computes
each of its branches (sigmoid, subtraction, GELU) under masks over the whole concatenation and
reads the attention through a transpose, at about half the bandwidth one GPU's kernel reaches.

So the last merge is an op of its own (:func:`merge_attention`), opaque to the compiler: a
Triton kernel reads both attentions ``[batch, heads, tokens, dim]`` and their log-sum-exps once,
and writes the merged attention in the model's dtype, tokens first (``[batch, tokens, heads,
dim]``, what the output projection reads), so the kernel after it is one GPU's again. Off CUDA
the op computes the same formula in torch (:func:`reference`); the CPU tests run the kernel under
``TRITON_INTERPRET=1``.

Measured in one call on 2 H200s (``fluxmerge``, FLUX 1024², alternated): the ring made 2.243 /
2.243 s an image with the kernel against 2.282 / 2.280 s with the fused merge (one GPU 3.830 s);
the kernel after the attention took 0.06 s a rank and the merge 0.017 s.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def merge_pair(
    out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attentions of the same queries over disjoint keys, as one, in fp32: weighted by the
    share of the softmax's mass each saw. ``out`` and ``other`` are ``[batch, heads, tokens,
    dim]``, their log-sum-exps ``[batch, heads, tokens]`` (or with a trailing 1); returns the
    merged attention and its log-sum-exp ``[batch, heads, tokens, 1]``."""
    batch, heads, tokens, _ = other.shape
    lse = lse.float().reshape(batch, heads, tokens, 1)
    other_lse = other_lse.float().reshape(batch, heads, tokens, 1)
    out = out.float()
    out = out - torch.sigmoid(other_lse - lse) * (out - other.float())
    return out, lse - torch.nn.functional.logsigmoid(lse - other_lse)


def reference(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> torch.Tensor:
    """:func:`merge_pair` as the kernel returns it: ``[batch, tokens, heads, dim]`` contiguous
    in ``other``'s dtype."""
    merged, _ = merge_pair(out, lse, other, other_lse)
    return merged.to(other.dtype).transpose(1, 2).contiguous()


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def merge_kernel(
        out_ptr,
        lse_ptr,
        other_ptr,
        other_lse_ptr,
        dst_ptr,
        HEADS,
        TOKENS,
        DIM,
        so_b,
        so_h,
        so_t,
        so_d,
        sl_b,
        sl_h,
        sl_t,
        sp_b,
        sp_h,
        sp_t,
        sp_d,
        sq_b,
        sq_h,
        sq_t,
        BLOCK_T: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # one program: one (batch, head) and BLOCK_T of its tokens, every dim
        bh = tl.program_id(0)
        b = bh // HEADS
        h = bh % HEADS
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        d = tl.arange(0, BLOCK_D)
        t_ok = t < TOKENS
        ok = t_ok[:, None] & (d < DIM)[None, :]
        lse = tl.load(lse_ptr + b * sl_b + h * sl_h + t * sl_t, mask=t_ok, other=0.0).to(tl.float32)
        other_lse = tl.load(other_lse_ptr + b * sq_b + h * sq_h + t * sq_t, mask=t_ok, other=0.0).to(tl.float32)
        share = tl.sigmoid(other_lse - lse)  # the other attention's share of the softmax's mass
        x = tl.load(out_ptr + b * so_b + h * so_h + t[:, None] * so_t + d[None, :] * so_d, mask=ok, other=0.0)
        y = tl.load(other_ptr + b * sp_b + h * sp_h + t[:, None] * sp_t + d[None, :] * sp_d, mask=ok, other=0.0)
        x = x.to(tl.float32)
        merged = x - share[:, None] * (x - y.to(tl.float32))
        dst = dst_ptr + ((b * TOKENS + t[:, None]) * HEADS + h) * DIM + d[None, :]
        tl.store(dst, merged.to(dst_ptr.dtype.element_ty), mask=ok)

    return merge_kernel


def merge(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> torch.Tensor:
    """:func:`reference` by the Triton kernel (on the GPU, or on the CPU under the interpreter)."""
    import triton

    batch, heads, tokens, dim = other.shape
    lse = lse.reshape(batch, heads, tokens)
    other_lse = other_lse.reshape(batch, heads, tokens)
    dst = torch.empty((batch, tokens, heads, dim), dtype=other.dtype, device=other.device)
    block_t = 64
    grid = (batch * heads, triton.cdiv(tokens, block_t))
    _kernel()[grid](
        out, lse, other, other_lse, dst, heads, tokens, dim,
        *out.stride(), *lse.stride(), *other.stride(), *other_lse.stride(),
        BLOCK_T=block_t, BLOCK_D=triton.next_power_of_2(dim), num_warps=4,
    )  # fmt: skip
    return dst


# ``flexible_layout``: the kernel reads its inputs by their strides, so the compiler need not
# copy them into the layout they had when traced (it did: two copies a block, 0.015 s an image
# on a ring rank, ``fluxmerge``, 2 H200s)
@torch.library.custom_op("diffq::merge_attention", mutates_args=(), tags=(torch.Tag.flexible_layout,))
def merge_attention(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> torch.Tensor:
    """One op for the compiler, which keeps it out of the kernels around it: the Triton kernel
    on CUDA, :func:`reference` elsewhere."""
    run = merge if other.device.type == "cuda" else reference
    return run(out, lse, other, other_lse)


@merge_attention.register_fake
def _(out: torch.Tensor, lse: torch.Tensor, other: torch.Tensor, other_lse: torch.Tensor) -> torch.Tensor:
    batch, heads, tokens, dim = other.shape
    return other.new_empty((batch, tokens, heads, dim))
