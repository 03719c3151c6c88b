"""FP8 convolutions as an implicit GEMM in Triton, for Hopper's FP8 tensor cores.

Why a kernel of our own: cuDNN computes SDXL's 3x3 convolutions in fp16 (a fifth of a UNet
step on an H100, docs/benchmarks.md) and PyTorch has no FP8 convolution to call; torchao's
needs Blackwell. An implicit GEMM reads the channels-last activation in place: output pixel
``m`` and input tap ``(kh, kw, c)`` are row and column of a GEMM whose left operand is never
written out (no im2col buffer), ``M = N * Ho * Wo``, ``K = KH * KW * C``, ``N = C_out``.

The activation arrives already in FP8 with a static per-tensor scale (the compiler fuses that
cast into the normalization before it, as for the FP8 linears in :mod:`worker.pipelines.fp8`);
the weight is FP8 with its own per-tensor scale, stored ``[C_out, KH * KW * C]`` so that both
operands are contiguous along K, the layout Hopper's FP8 ``wgmma`` reads. The accumulator is
fp32; the epilogue multiplies by the product of the two scales, adds the bias and writes the
model's dtype, channels-last.

Triton is imported when a kernel is first launched, so the module imports on machines without
it. The CPU tests run the kernel under ``TRITON_INTERPRET=1``, which must be set before Triton is
first imported (its library functions are built then).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import torch

from common.settings import triton_interpreted


def available(device: torch.device) -> bool:
    """Whether the op runs on ``device``: off CUDA the reference always does; on CUDA the Triton
    kernel needs Triton (CUDA builds of torch bring it)."""
    return device.type != "cuda" or importlib.util.find_spec("triton") is not None


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def empty_output(
    x: torch.Tensor,
    c_out: int,
    kernel: tuple[int, int],
    stride: int,
    padding: int,
    out_dtype: torch.dtype,
    channels_last_out: bool,
) -> torch.Tensor:
    """The output of a convolution of ``x``, unwritten: one place for its shape and layout, so the
    op's fake implementation (what the compiler plans with) and the kernel's agree."""
    batch, _, height, width = x.shape
    shape = (batch, c_out, out_size(height, kernel[0], stride, padding), out_size(width, kernel[1], stride, padding))
    layout = torch.channels_last if channels_last_out else torch.contiguous_format
    return torch.empty(shape, device=x.device, dtype=out_dtype, memory_format=layout)


def weight_matrix(weight: torch.Tensor) -> torch.Tensor:
    """``[C_out, C, KH, KW]`` -> ``[C_out, KH * KW * C]``: K ordered tap-major, channel-minor,
    the order the kernel walks the channels-last input in."""
    return weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1).contiguous()


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    shapes = (
        ((16, 16, 16, 1, 1),)  # the interpreter runs each block on the CPU: small ones, one config
        if triton_interpreted()
        else (
            (128, 128, 64, 4, 8),
            (128, 128, 128, 3, 8),
            (128, 256, 64, 3, 8),
            (128, 256, 128, 3, 8),
            (256, 128, 64, 3, 8),
            (256, 128, 128, 3, 8),
            (128, 64, 128, 4, 4),
            (64, 128, 128, 4, 4),
        )
    )
    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_stages=s, num_warps=w)
        for m, n, k, s, w in shapes
    ]

    # the timings are kept on disk (TRITON_CACHE_DIR, beside the compile cache): a restarted
    # worker reuses them instead of timing every config of every shape again
    @triton.autotune(configs=configs, key=["C", "C_OUT", "H", "W", "BATCH", "STRIDE", "SO_C"], cache_results=True)
    @triton.jit
    def conv2d_fp8_kernel(
        x_ptr,
        w_ptr,
        bias_ptr,
        scale_ptr,
        out_ptr,
        BATCH,
        H,
        W,
        C,
        HO,
        WO,
        C_OUT,
        SO_N,
        SO_C,
        SO_H,
        SO_W,
        KH: tl.constexpr,
        KW: tl.constexpr,
        STRIDE: tl.constexpr,
        PAD: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        m_total = BATCH * HO * WO
        pids_m = tl.cdiv(m_total, BLOCK_M)
        pids_n = tl.cdiv(C_OUT, BLOCK_N)
        # grouped order: neighbouring programs share rows of the input and reuse them from L2
        per_group = GROUP_M * pids_n
        group = pid // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(pids_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % per_group) % size_m)
        pid_n = (pid % per_group) // size_m

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        image = offs_m // (HO * WO)
        pixel = offs_m % (HO * WO)
        top = (pixel // WO) * STRIDE - PAD
        left = (pixel % WO) * STRIDE - PAD
        out_rows = image * SO_N + (pixel // WO) * SO_H + (pixel % WO) * SO_W
        row_ok = offs_m < m_total
        col_ok = offs_n < C_OUT
        k_total = KH * KW * C

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        chunks = tl.cdiv(C, BLOCK_K)
        for step in range(0, KH * KW * chunks):
            tap = step // chunks
            c0 = (step % chunks) * BLOCK_K
            ih = top + tap // KW
            iw = left + tap % KW
            inside = row_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            channels = c0 + offs_k
            channel_ok = channels < C
            a_ptrs = x_ptr + (((image * H + ih) * W + iw) * C)[:, None] + channels[None, :]
            a = tl.load(a_ptrs, mask=inside[:, None] & channel_ok[None, :], other=0.0)
            b_ptrs = w_ptr + offs_n[None, :] * k_total + (tap * C + channels)[:, None]
            b = tl.load(b_ptrs, mask=channel_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc)

        acc = acc * tl.load(scale_ptr)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        out_ptrs = out_ptr + out_rows[:, None] + offs_n[None, :] * SO_C
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])

    return conv2d_fp8_kernel


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    kernel: tuple[int, int],
    stride: int,
    padding: int,
    out_dtype: torch.dtype,
    channels_last_out: bool = True,
) -> torch.Tensor:
    """``conv2d(x, w) * scale + bias`` from an activation ``x`` ``[N, C, H, W]`` and a weight
    matrix from :func:`weight_matrix`, both of one dtype (FP8 on the GPU; any float under the
    interpreter). ``x`` should be channels-last in memory (the kernel reads a pixel's channels as
    one row); any other layout is copied first, which costs more than the convolution. ``scale``
    is a one-element fp32 tensor (the activation's scale times the weight's), read on the device
    so a compiled graph never syncs on it. Returns ``[N, C_out, Ho, Wo]`` in ``out_dtype``,
    channels-last or, with ``channels_last_out=False``, contiguous (the layout the next layer
    reads best: a UNet run in NCHW normalizes each group of channels as one contiguous block)."""
    batch, channels, height, width = x.shape
    kh, kw = kernel
    c_out = weight.shape[0]
    if weight.shape[1] != kh * kw * channels:
        raise ValueError(f"weight matrix {tuple(weight.shape)} does not fit {channels} channels and a {kh}x{kw} kernel")
    x = x.contiguous(memory_format=torch.channels_last)
    out = empty_output(x, c_out, kernel, stride, padding, out_dtype, channels_last_out)
    ho, wo = out.shape[2:]
    launch = _kernel()

    def grid(meta: dict[str, int]) -> tuple[int]:
        return (-(-batch * ho * wo // meta["BLOCK_M"]) * -(-c_out // meta["BLOCK_N"]),)

    launch[grid](
        x,
        weight,
        bias if bias is not None else scale,
        scale,
        out,
        batch,
        height,
        width,
        channels,
        ho,
        wo,
        c_out,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        out.stride(3),
        KH=kh,
        KW=kw,
        STRIDE=stride,
        PAD=padding,
        HAS_BIAS=bias is not None,
    )
    return out


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    kernel: tuple[int, int],
    stride: int,
    padding: int,
    out_dtype: torch.dtype,
    channels_last_out: bool = True,
) -> torch.Tensor:
    """What :func:`conv2d` computes, by ``F.conv2d`` in fp32 on the FP8 values: the CPU's path
    (the tests' tiny model), where no Triton kernel runs."""
    kh, kw = kernel
    c_out = weight.shape[0]
    w = weight.float().reshape(c_out, kh, kw, -1).permute(0, 3, 1, 2)
    out = torch.nn.functional.conv2d(x.float(), w, stride=stride, padding=padding) * scale.float()
    if bias is not None:
        out = out + bias.float().reshape(1, -1, 1, 1)
    layout = torch.channels_last if channels_last_out else torch.contiguous_format
    return out.to(out_dtype).contiguous(memory_format=layout)


@torch.library.custom_op("diffq::conv2d_fp8", mutates_args=())
def conv2d_fp8(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    kh: int,
    kw: int,
    stride: int,
    padding: int,
    out_dtype: torch.dtype,
    channels_last_out: bool,
) -> torch.Tensor:
    """One op for the compiler: it fuses the activation's cast to FP8 into the kernel before and
    calls the Triton kernel as it is (on the GPU; :func:`reference` elsewhere)."""
    run = conv2d if x.device.type == "cuda" else reference
    return run(x, weight, scale, bias, (kh, kw), stride, padding, out_dtype, channels_last_out)


@conv2d_fp8.register_fake
def _(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    kh: int,
    kw: int,
    stride: int,
    padding: int,
    out_dtype: torch.dtype,
    channels_last_out: bool,
) -> torch.Tensor:
    return empty_output(x, weight.shape[0], (kh, kw), stride, padding, out_dtype, channels_last_out)
