"""Do a ring rank's GEMMs cost half of one GPU's? FLUX's matrix products at one GPU's rows and
at a ring-of-2 rank's, on one GPU.

A ring rank of 2 holds half of an image's tokens (1024²: 2,048 image and 256 text rows against
4,096 and 512), so each of its products has half the rows of one GPU's. Profiled, a rank's
GEMMs took 1.29 s an image against one GPU's 2.35 s: 10 % over half, the largest piece of what
keeps the ring from 2×. Two parts, each at both row counts:

- ``shapes``: every distinct product of FLUX.1's blocks as ``F.linear`` through cuBLAS, timed
  with CUDA events, weighted by how often an image runs it (28 steps; 19 double-stream blocks, 38
  single-stream): what half the rows cost by shape, and the excess over half in seconds.
- ``blocks``: one double-stream and one single-stream block (FLUX.1's sizes, random weights, the
  modulation vectors fixed as ``modulation-once`` leaves them) compiled as ``compile-blocks``
  does, and again with Inductor's GEMM autotuning (Triton templates against cuBLAS per shape),
  and with its persistent TMA templates (each CTA walks several output tiles: no last wave of
  idle SMs). Projected to an image: 28 × (19 double + 38 single). The attention is SDPA over the
  rows present (a rank's real attention spans all keys in two calls), the same in every mode, so
  the modes' differences are the products' and their fusions'.

    python3 bench/flux_gemms.py --out $OUT/gemms.jsonl --budget-s 500
    python3 bench/flux_gemms.py --out /tmp/g.jsonl --device cpu --dim 64 --heads 2 --size 256 --modes compile  # quick
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from regions import STARTED, emit

STEPS, DOUBLE, SINGLE = 28, 19, 38
# Inductor settings per mode, set before the mode's first call (its compile and autotuning).
MODES: dict[str, dict[str, Any]] = {
    "compile": {},
    "gemmtune": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "ATEN,TRITON"},
    "gemmtune-tma": {
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "ATEN,TRITON",
        "triton.enable_persistent_tma_matmul": True,
    },
}


def rows(tokens: str, size: int) -> tuple[int, int]:
    """Image and text rows: one GPU's (``all``) or a ring-of-2 rank's (``half``)."""
    image, text = (size // 16) ** 2, 512
    return (image, text) if tokens == "all" else (image // 2, text // 2)


def products(image: int, text: int, dim: int, layout: str = "separate") -> list[tuple[str, int, int, int, int]]:
    """(name, rows, in, out, calls per step) of every product in FLUX's blocks but the
    modulation's one-row ones (computed once an image under ``modulation-once``). ``layout``:
    ``separate`` (diffusers' default: q, k and v three products), ``fused`` (``fuse-qkv``: one
    product of three times the width), ``fused-mlp`` (the single-stream block's q, k, v and MLP
    input as one product, as FLUX's reference code has it: they read the same normalized rows)."""
    mlp = 4 * dim
    qkv = [("qkv", dim, dim, 3)] if layout == "separate" else [("qkv", dim, 3 * dim, 1)]
    out: list[tuple[str, int, int, int, int]] = []
    for stream, m in (("img", image), ("txt", text)):
        out += [(f"double.{stream}.{n}", m, k, w, c * DOUBLE) for n, k, w, c in qkv]
        out += [
            (f"double.{stream}.out", m, dim, dim, DOUBLE),
            (f"double.{stream}.ff1", m, dim, mlp, DOUBLE),
            (f"double.{stream}.ff2", m, mlp, dim, DOUBLE),
        ]
    both = image + text
    if layout == "fused-mlp":
        out.append(("single.qkv-mlp", both, dim, 3 * dim + mlp, SINGLE))
    else:
        out += [(f"single.{n}", both, k, w, c * SINGLE) for n, k, w, c in qkv]
        out.append(("single.mlp", both, dim, mlp, SINGLE))
    out.append(("single.out", both, dim + mlp, dim, SINGLE))
    return out


def cuda_ms(fn: Callable[[], Any], repeats: int, device: torch.device, chunk: int = 10) -> tuple[float, float]:
    """First call (compile and tuning, if any) by the wall clock, then the median steady call in
    ms: CUDA events around chunks of back-to-back calls, so the host queues ahead as a CUDA
    graph's replay would and its launch time is not counted."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    fn()
    sync()
    first = 1e3 * (time.perf_counter() - started)
    for _ in range(3):
        fn()
    times = []
    for _ in range(max(1, repeats // chunk)):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(chunk):
                fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / chunk)
        else:
            t = time.perf_counter()
            for _ in range(chunk):
                fn()
            times.append(1e3 * (time.perf_counter() - t) / chunk)
    times.sort()
    return first, times[len(times) // 2]


def shapes(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    """Each product through cuBLAS at both row counts, and the excess over half per image, for
    each layout of the projections."""
    for layout in args.layouts:
        totals = {}
        for tokens in ("all", "half"):
            total = 0.0
            for name, m, k, n, calls in products(*rows(tokens, args.size), args.dim, layout):
                x = torch.randn(m, k, device=device, dtype=dtype)
                w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
                b = torch.randn(n, device=device, dtype=dtype)
                _, ms = cuda_ms(lambda x=x, w=w, b=b: F.linear(x, w, b), args.repeats, device)
                per_image = calls * STEPS * ms / 1e3
                total += per_image
                tflops = 2 * m * k * n / (ms / 1e3) / 1e12
                emit(
                    args.out,
                    {
                        "part": "shape",
                        "layout": layout,
                        "tokens": tokens,
                        "name": name,
                        "m": m,
                        "k": k,
                        "n": n,
                        "ms": round(ms, 4),
                        "tflops": round(tflops, 1),
                        "s_per_img": round(per_image, 4),
                    },
                )
            totals[tokens] = total
        emit(
            args.out,
            {
                "part": "shapes",
                "layout": layout,
                "s_per_img_all": round(totals["all"], 4),
                "s_per_img_half": round(totals["half"], 4),
                "over_half_s": round(totals["half"] - totals["all"] / 2, 4),
                "over_half_pct": round(100 * (2 * totals["half"] / totals["all"] - 1), 1),
            },
        )


class Fixed(torch.nn.Module):
    """A modulation layer's output, fixed: under ``modulation-once`` a step reads its vectors
    from a table computed at the image's first step, not from a product in the block."""

    def __init__(self, out: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("out", out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out


def make_blocks(dim: int, heads: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.nn.Module]:
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock

    blocks = {
        "double": FluxTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=dim // heads),
        "single": FluxSingleTransformerBlock(dim=dim, num_attention_heads=heads, attention_head_dim=dim // heads),
    }
    for block in blocks.values():
        block.to(device=device, dtype=dtype).eval().requires_grad_(False)
        for norm in (getattr(block, n, None) for n in ("norm1", "norm1_context", "norm")):
            if norm is not None:
                width = norm.linear.out_features
                norm.linear = Fixed(0.1 * torch.randn(1, width, device=device, dtype=dtype))
    return blocks


def block_inputs(tokens: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    image, text = rows(tokens, args.size)
    head_dim = args.dim // args.heads
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device=device, dtype=dt)

    return {
        "hidden_states": randn(1, image, args.dim),
        "encoder_hidden_states": randn(1, text, args.dim),
        "temb": randn(1, args.dim),
        "image_rotary_emb": (
            randn(text + image, head_dim, dt=torch.float32),
            randn(text + image, head_dim, dt=torch.float32),
        ),
    }


def blocks(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    """Each mode's compiled blocks at both row counts, projected to an image; skipped when the
    budget is nearly spent (a mode's first call tunes every shape it meets)."""
    eager = make_blocks(args.dim, args.heads, device, dtype)
    fused = copy.deepcopy(eager)
    for block in fused.values():
        block.attn.fuse_projections()
    per_image: dict[tuple[str, str], float] = {}
    for mode in args.modes:
        settings, _, layout = mode.partition("+")
        for tokens in ("half", "all"):
            left = args.budget_s - (time.perf_counter() - STARTED)
            if left < args.min_left_s:
                emit(args.out, {"part": "block", "mode": mode, "tokens": tokens, "skipped": f"{left:.0f} s left"})
                continue
            torch._dynamo.reset()
            total = 0.0
            with torch._inductor.config.patch(MODES[settings]):
                for kind, block in (fused if layout == "fused" else eager).items():
                    compiled = torch.compile(block, fullgraph=True, dynamic=False)
                    inputs = block_inputs(tokens, args, device, dtype)
                    with torch.inference_mode():
                        first, ms = cuda_ms(lambda c=compiled, i=inputs: c(**i), args.repeats, device)
                    calls = DOUBLE if kind == "double" else SINGLE
                    total += calls * STEPS * ms / 1e3
                    emit(
                        args.out,
                        {
                            "part": "block",
                            "mode": mode,
                            "tokens": tokens,
                            "block": kind,
                            "first_call_s": round(first / 1e3, 1),
                            "ms": round(ms, 4),
                            "s_per_img": round(calls * STEPS * ms / 1e3, 4),
                        },
                    )
            per_image[(mode, tokens)] = total
            emit(args.out, {"part": "blocks", "mode": mode, "tokens": tokens, "s_per_img": round(total, 4)})
        if (mode, "all") in per_image and (mode, "half") in per_image:
            all_, half = per_image[(mode, "all")], per_image[(mode, "half")]
            emit(
                args.out,
                {
                    "part": "blocks-ratio",
                    "mode": mode,
                    "s_per_img_all": round(all_, 4),
                    "s_per_img_half": round(half, 4),
                    "over_half_pct": round(100 * (2 * half / all_ - 1), 1),
                },
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, appended")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=1024, help="image side in pixels (16 pixels a token)")
    ap.add_argument("--dim", type=int, default=3072, help="FLUX.1: 3072")
    ap.add_argument("--heads", type=int, default=24, help="FLUX.1: 24")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--parts", default="shapes,blocks")
    ap.add_argument(
        "--modes",
        default="compile,gemmtune,gemmtune-tma",
        type=lambda s: s.split(","),
        help="Inductor settings per block compile; a mode ending +fused runs the blocks with fuse-qkv's projections",
    )
    ap.add_argument("--layouts", default="separate,fused,fused-mlp", type=lambda s: s.split(","))
    ap.add_argument("--budget-s", type=float, default=500.0, help="the script's whole time")
    ap.add_argument("--min-left-s", type=float, default=60.0, help="no new mode's compile with less left")
    args = ap.parse_args()
    unknown = {m for m in args.modes if m.partition("+")[0] not in MODES or m.partition("+")[2] not in ("", "fused")}
    if unknown:
        ap.error(f"--modes: unknown {','.join(sorted(unknown))}; known: {','.join(MODES)}")
    device = torch.device(args.device)
    dtype = torch.bfloat16
    head = {
        "part": "env",
        "torch": torch.__version__,
        "size": args.size,
        "dim": args.dim,
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    }
    emit(args.out, head)
    with torch.inference_mode():
        if "shapes" in args.parts:
            shapes(args, device, dtype)
    if "blocks" in args.parts:
        blocks(args, device, dtype)


if __name__ == "__main__":
    main()
