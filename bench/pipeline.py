"""Bare-pipeline benchmark on one GPU: the baseline, batch sizes, and each speed lever.

Runs the same code the worker runs (``worker.pipelines.models.sdxl_random``, ``worker.pipelines.generate.run_batch``,
``worker.pipelines.speedups.apply``), minus Redis and PNG writing, and writes one JSON line per
measurement to ``--out`` as soon as it is taken (a killed run keeps what it measured).

    python3 bench/pipeline.py --out $OUT/pipeline.jsonl --batches 1,4,8 --levers vae-fp16,fuse-qkv
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.jobspec import GenParams
from worker.pipelines.generate import run_batch
from worker.pipelines.models import sdxl_random
from worker.pipelines.speedups import Speedups
from worker.pipelines.speedups import apply as apply_speedups

PROMPTS = [f"a photo of a {w} on a wooden table, studio light" for w in ("cat", "teapot", "lamp", "fox") * 8]


def emit(out: Path, record: dict) -> None:
    record = {"t": round(time.time(), 1), **record}
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def matmul_tflops(n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12


def count_flops(pipe, params: GenParams) -> dict[str, float]:
    """FLOPs of one UNet call at batch 2 (one image with CFG) and one VAE decode, counted by torch."""
    from torch.utils.flop_counter import FlopCounterMode

    h, w = params.height // 8, params.width // 8
    unet = pipe.unet
    sample = torch.randn(2, 4, h, w, device="cuda", dtype=unet.dtype)
    text = torch.randn(2, 77, 2048, device="cuda", dtype=unet.dtype)
    added = {
        "text_embeds": torch.randn(2, 1280, device="cuda", dtype=unet.dtype),
        "time_ids": torch.randn(2, 6, device="cuda", dtype=unet.dtype),
    }
    with torch.inference_mode():
        with FlopCounterMode(display=False) as counter:
            unet(sample, 500, encoder_hidden_states=text, added_cond_kwargs=added)
        unet_flops = counter.get_total_flops()
        latents = torch.randn(1, 4, h, w, device="cuda", dtype=pipe.vae.dtype)
        with FlopCounterMode(display=False) as counter:
            pipe.vae.decode(latents)
        vae_flops = counter.get_total_flops()
    return {"unet_call_b2_tflop": unet_flops / 1e12, "vae_decode_tflop": vae_flops / 1e12}


def time_calls(fn, repeats: int) -> list[float]:
    """Median-ready call times; the first (warm-up: cudnn autotune, allocator, lazy compile) is last in the list."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    warmup = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return [*times, warmup]


def measure(out, label, pipe, params, batch, repeats, levers, extra=None) -> dict:
    torch.cuda.reset_peak_memory_stats()
    breakdowns = []

    def once():
        result = run_batch(pipe, params, PROMPTS[:batch], [""] * batch, list(range(batch)))
        breakdowns.append(result)
        assert len(result.images) == batch

    *times, warmup = time_calls(once, repeats)
    last = breakdowns[-1]
    per_call = statistics.median(times)
    record = {
        "kind": "pipeline",
        "label": label,
        "batch": batch,
        "levers": levers,
        "s_per_call": round(per_call, 4),
        "img_per_s": round(batch / per_call, 4),
        "s_per_img": round(per_call / batch, 4),
        "calls": [round(t, 4) for t in times],
        "warmup_call_s": round(warmup, 2),
        "encode_s": round(last.encode_s, 4),
        "denoise_s": round(last.denoise_s, 4),
        "unet_step_ms": round(1e3 * last.denoise_s / params.steps, 2),
        "decode_s": round(last.decode_s, 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        **(extra or {}),
    }
    emit(out, record)
    return record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--lever-batch", type=int, default=8)
    ap.add_argument("--levers", default="vae-fp16,fuse-qkv", help="applied cumulatively, in order")
    ap.add_argument("--final-batches", default="", help="batches to measure with all levers on")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    began = time.monotonic()
    params = GenParams(model="sdxl-random", width=args.size, height=args.size, steps=args.steps, guidance=5.0)

    props = torch.cuda.get_device_properties(0)
    import diffusers

    emit(
        args.out,
        {
            "kind": "env",
            "gpu": props.name,
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "cuda": torch.version.cuda,
            "matmul_fp16_tflops": round(matmul_tflops(), 1),
        },
    )
    built = time.perf_counter()
    pipe = sdxl_random("cuda", torch.float16)
    pipe.set_progress_bar_config(disable=True)
    emit(
        args.out,
        {
            "kind": "build",
            "seconds": round(time.perf_counter() - built, 1),
            "unet_params_b": round(sum(p.numel() for p in pipe.unet.parameters()) / 1e9, 3),
        },
    )
    emit(args.out, {"kind": "flops", **{k: round(v, 3) for k, v in count_flops(pipe, params).items()}})

    if not args.skip_baseline:
        # What the usual one-prompt-at-a-time script does: a plain pipeline call per image
        def plain():
            pipe(
                prompt=PROMPTS[0],
                num_inference_steps=args.steps,
                guidance_scale=5.0,
                width=args.size,
                height=args.size,
                generator=torch.Generator("cpu").manual_seed(0),
            )

        *times, _ = time_calls(plain, args.repeats + 1)
        per = statistics.median(times)
        emit(
            args.out,
            {
                "kind": "pipeline",
                "label": "baseline: plain pipe() call, 1 image, eager",
                "batch": 1,
                "levers": "none",
                "s_per_call": round(per, 4),
                "img_per_s": round(1 / per, 4),
                "s_per_img": round(per, 4),
                "calls": [round(t, 4) for t in times],
            },
        )

    for batch in [int(b) for b in args.batches.split(",") if b]:
        if time.monotonic() - began > args.budget_s:
            break
        measure(args.out, f"run_batch, batch {batch}", pipe, params, batch, args.repeats, "none")

    applied: list[str] = []
    for lever in [lever for lever in args.levers.split(",") if lever]:
        if time.monotonic() - began > args.budget_s:
            emit(args.out, {"kind": "skipped", "lever": lever, "why": "time budget"})
            break
        seconds = apply_speedups(pipe, Speedups(frozenset([lever])))
        applied.append(lever)
        first = time.perf_counter()
        measure(
            args.out,
            f"+{lever}",
            pipe,
            params,
            args.lever_batch,
            args.repeats,
            ",".join(applied),
            {"apply_s": round(seconds, 2)},
        )
        emit(args.out, {"kind": "lever-wall", "lever": lever, "wall_s": round(time.perf_counter() - first, 1)})

    for batch in [int(b) for b in args.final_batches.split(",") if b]:
        if time.monotonic() - began > args.budget_s:
            break
        measure(args.out, f"all levers, batch {batch}", pipe, params, batch, args.repeats, ",".join(applied))

    # finite check of the last decode, and the fp16-vs-fp32 VAE difference on the same latents
    if "vae-fp16" in applied:
        from worker.pipelines.pixels import decode

        latents = torch.randn(1, 4, args.size // 8, args.size // 8, device="cuda", dtype=torch.float16)
        with torch.inference_mode():
            fp16 = decode(pipe, latents).float()
            pipe.vae.config.force_upcast = True
            fp32 = decode(pipe, latents).float()
            pipe.vae.config.force_upcast = False
        emit(
            args.out,
            {
                "kind": "vae-check",
                "finite": bool(torch.isfinite(fp16).all()),
                "max_abs_diff_0_1": round(float((fp16 - fp32).abs().max() / 2), 5),
            },
        )


if __name__ == "__main__":
    main()
