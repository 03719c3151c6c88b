"""One GPU: diffq's FP8 GEMM (``worker/pipelines/fp8_gemm.py``) against ``torch._scaled_mm``.

The CPU tests run the fp32 reference in place of torch's CPU FP8 kernels (their speed and their
overflow behaviour depend on the CPU model); this script checks, on a GPU, that the reference is
what cuBLASLt computes, that an FP8 output saturates, and what the saturation costs:

- ``agree``: SDXL's GEMM shapes (rows of one 1024² batch of 8 with CFG; K and N of its attention,
  feed-forward and GEGLU layers): ``torch._scaled_mm`` (fp16 and FP8 out, per-tensor scales; bf16
  out with row scales) against the reference on the same FP8 operands; the largest error relative
  to the output's magnitude.
- ``overshoot``: an FP8 output scaled so that a third of it is past ±448: NaN written by
  cuBLASLt itself and after ``scaled_mm`` (its saturation), and whether both equal the reference.
- ``compiled``: a GEGLU-shaped ``StaticFP8Linear`` writing FP8 and the GELU that reads it, under
  ``torch.compile``, with the saturation and without it (``saturate`` replaced by identity),
  alternated: milliseconds a call.

    python3 bench/fp8_gemm.py --out $OUT/fp8_gemm.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from record import write  # noqa: E402

from worker.pipelines import fp8, fp8_gemm  # noqa: E402

E4M3 = fp8_gemm.E4M3
#: (M, K, N): rows of a 1024² batch of 8 with CFG at the UNet's first and second levels
SHAPES = [(16 * 4096, 640, 640), (16 * 4096, 640, 5120), (16 * 1024, 1280, 10240), (16 * 1024, 5120, 1280)]


def operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = (torch.randn(m, k, device="cuda") * 60).clamp(-448, 448).to(E4M3)
    b = (torch.randn(n, k, device="cuda") * 60).clamp(-448, 448).to(E4M3).t()  # column-major, as the layer's
    return a, b


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp(min=1e-12))


def fp8_steps(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    """Two FP8 tensors apart: the share of elements that differ, and the most E4M3 steps between
    two (the bytes of one sign are ordered as their values)."""
    a, b = got.view(torch.uint8).int(), want.view(torch.uint8).int()
    ordinal = lambda t: torch.where(t >= 0x80, -(t - 0x80), t)  # noqa: E731 - a line's helper
    steps = (ordinal(a) - ordinal(b)).abs()
    return {"differ": round(float((steps > 0).float().mean()), 6), "max_steps": int(steps.max())}


def agree(out: Path | None) -> None:
    for m, k, n in SHAPES:
        a, b = operands(m, k, n)
        one = torch.tensor(1.0 / (k * 60.0), device="cuda")
        sb = torch.tensor(1.0 / 60.0, device="cuda")
        for out_dtype in (torch.float16, E4M3):
            # fp16 out: values about 1; FP8 out: about 100, within ±448
            scale_a = one if out_dtype != E4M3 else torch.tensor(100.0 / (60.0 * k**0.5), device="cuda")
            real = fp8_gemm.cuda_gemm(a, b, scale_a, sb, None, out_dtype, False)
            ref = fp8_gemm.reference(a, b, scale_a, sb, None, out_dtype)
            extra = fp8_steps(real, ref) if out_dtype == E4M3 else {}
            write(out, "agree", m=m, k=k, n=n, out_dtype=str(out_dtype), rel_error=relative(real, ref), **extra)
        rows = torch.full((m, 1), float(one), device="cuda")
        cols = torch.full((1, n), float(sb), device="cuda")
        real = fp8_gemm.cuda_gemm(a, b, rows, cols, None, torch.bfloat16, False)
        ref = fp8_gemm.reference(a, b, rows, cols, None, torch.bfloat16)
        write(out, "agree", m=m, k=k, n=n, out_dtype="bfloat16-rowwise", rel_error=relative(real, ref))


def overshoot(out: Path | None) -> None:
    m, k, n = SHAPES[1]
    a, b = operands(m, k, n)
    # outputs with a spread of 600 (a@b's is 60 * 60 * sqrt(k)): about half past ±448
    sb = torch.tensor(1.0 / 60.0, device="cuda")
    sa = torch.tensor(600.0 / (60.0 * k**0.5), device="cuda")
    want = (a.float() @ b.float()) * sa * sb
    raw = fp8_gemm.cuda_gemm(a, b, sa, sb, None, E4M3, False)
    saturated = fp8_gemm.scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=E4M3)
    ref = fp8_gemm.reference(a, b, sa, sb, None, E4M3)
    write(
        out,
        "overshoot",
        past_448=int((want.abs() > 448).sum()),
        outputs=want.numel(),
        nan_cublas=int(torch.isnan(raw.float()).sum()),
        nan_saturated=int(torch.isnan(saturated.float()).sum()),
        past_448_cublas_at_448=int((raw.float().abs() == 448).logical_and(want.abs() > 448).sum()),
        cublas_vs_reference=fp8_steps(raw, ref),
        saturated_vs_reference=fp8_steps(saturated, ref),
    )


def compiled(out: Path | None, calls: int = 50, rounds: int = 5) -> None:
    m, k, n = SHAPES[1]
    linear = torch.nn.Linear(k, n, device="cuda", dtype=torch.float16).requires_grad_(False)
    x = torch.randn(16, m // 16, k, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        amax_out = float(linear(x).abs().amax())
    layer = fp8.StaticFP8Linear.replacing(linear, float(x.abs().amax()), "tensor", amax_out)

    def block(inp: torch.Tensor) -> torch.Tensor:
        hidden, gate = layer(inp).chunk(2, dim=-1)
        return hidden * fp8.tanh_gelu(gate)

    real_saturate = fp8_gemm.saturate
    variants = {}
    for name, saturate in (("saturated", real_saturate), ("plain", lambda t: t)):
        fp8_gemm.saturate = saturate
        torch._dynamo.reset()
        fn = torch.compile(block, fullgraph=True, dynamic=False)
        with torch.no_grad():
            result = fn(x)
        variants[name] = (fn, result)
    fp8_gemm.saturate = real_saturate
    same = bool(torch.equal(variants["saturated"][1], variants["plain"][1]))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, _) in variants.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.no_grad():
                fn(x)
                start.record()
                for _ in range(calls):
                    fn(x)
                end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / calls)
    write(
        out,
        "compiled",
        m=m,
        k=k,
        n=n,
        same_output=same,
        saturated_ms=round(statistics.median(times["saturated"]), 4),
        plain_ms=round(statistics.median(times["plain"]), 4),
        rounds=rounds,
        calls=calls,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference's fp32 matmul, not TF32's
    torch.manual_seed(0)
    agree(args.out)
    overshoot(args.out)
    compiled(args.out)


if __name__ == "__main__":
    main()
