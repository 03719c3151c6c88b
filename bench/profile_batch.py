"""Where the time of one steady-state batch goes, on one GPU (issue: throughput, goal 6).

The worker's own code: ``sdxl_random`` fp16 with today's default levers (vae-fp16), one
warm-up batch, then one batch of 8 at 1024², 30 steps, CFG 5.0 timed phase by phase (prompt
encode, denoise, VAE decode from ``run_batch``; PNG encode in 8 threads and the atomic write,
as ``_save`` does) and one more under ``torch.profiler``: GPU kernel time by kind (GEMM,
attention, convolution, normalization, elementwise, copies) and the GPU's idle time inside
the denoising loop. The Chrome trace is written gzipped beside --out.

    python3 bench/profile_batch.py --out $OUT/profile.jsonl
    python3 bench/profile_batch.py --out $OUT/profile.jsonl --part decoder --batch 16 --speedups vae-fp16,compile-vae
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rank_profile import kind_of  # bench/, this script's own folder

from common.jobspec import GenParams
from worker.output.images import image_bytes, temp_dir, write_atomic
from worker.pipelines.generate import run_batch
from worker.pipelines.models import sdxl_random
from worker.pipelines.pixels import decode
from worker.pipelines.speedups import Speedups
from worker.pipelines.speedups import apply as apply_speedups

PROMPTS = [f"a photo of a {w} on a wooden table, studio light" for w in ("cat", "teapot", "lamp", "fox") * 2]


def emit(out: Path, record: dict) -> None:
    record = {"t": round(time.time(), 1), **record}
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def gpu_time(call: Callable[[], Any]) -> tuple[Any, list[Any], dict[str, float], dict[str, float]]:
    """One ``call`` under ``torch.profiler``: the profile, its GPU kernels, and their microseconds
    by kind (bench/rank_profile.py's classes) and by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for e in kernels:
        by_kind[kind_of(e.name)] += e.device_time
        by_name[e.name[:90]] += e.device_time
    return prof, kernels, by_kind, by_name


@torch.inference_mode()  # as the pipeline's call: no autograd graph of the decoder's activations
def profile_decoder(pipe: Any, args: argparse.Namespace, setting: dict) -> None:
    """The decode of ``--batch`` random latents as the worker decodes (``generate.decode``, its
    levers applied): median time of five, then one profiled, by kind of kernel."""
    latents = torch.randn(args.batch, 4, args.size // 8, args.size // 8, device="cuda", dtype=torch.float16)
    started = time.perf_counter()
    decode(pipe, latents)
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - started
    times = []
    for _ in range(5):
        started = time.perf_counter()
        decode(pipe, latents)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    _, _, by_kind, by_name = gpu_time(lambda: decode(pipe, latents))
    total = sum(by_kind.values())
    emit(
        args.out,
        {
            "kind": "decoder_time",
            **setting,
            "warm_up_s": round(warm_s, 1),
            "decode_ms": round(1e3 * sorted(times)[2], 2),
            "kernel_ms": round(total / 1e3, 2),
            "by_kind_ms": {k: round(v / 1e3, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[n, round(v / 1e3, 2)] for n, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:12]],
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--speedups", default="vae-fp16", help="the worker's levers, comma-separated")
    ap.add_argument("--part", choices=("batch", "decoder"), default="batch",
                    help="profile the whole batch, or the decode of --batch latents alone")  # fmt: skip
    args = ap.parse_args()
    import diffusers

    params = GenParams(model="sdxl-random", width=args.size, height=args.size, steps=args.steps, guidance=5.0)
    setting = {"batch": args.batch, "steps": args.steps, "size": args.size, "guidance": 5.0, "speedups": args.speedups}
    emit(
        args.out,
        {
            "kind": "env",
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            **setting,
        },
    )
    pipe = sdxl_random("cuda", torch.float16)
    pipe.set_progress_bar_config(disable=True)
    apply_speedups(pipe, Speedups(frozenset(args.speedups.split(","))))
    prompts, seeds = PROMPTS[: args.batch], list(range(args.batch))

    def batch():
        return run_batch(pipe, params, prompts, [""] * args.batch, seeds)

    if args.part == "decoder":
        profile_decoder(pipe, args, setting)
        return

    started = time.perf_counter()
    batch()  # warm-up: cudnn autotune, allocator, compile
    torch.cuda.synchronize()
    emit(args.out, {"kind": "warmup", **setting, "seconds": round(time.perf_counter() - started, 1)})
    started = time.perf_counter()
    result = batch()
    torch.cuda.synchronize()
    call_s = time.perf_counter() - started

    folder = Path(tempfile.mkdtemp(prefix="diffq-profile-"))
    records = [
        {"prompt": p, "seed": s, "model": "sdxl-random", "width": args.size}
        for p, s in zip(prompts, seeds, strict=True)
    ]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(8, args.batch)) as pool:
        blobs = list(pool.map(lambda pair: image_bytes(pair[1], pair[0]), zip(records, result.images, strict=True)))
    encoded = time.perf_counter()
    for i, blob in enumerate(blobs):
        write_atomic(folder / f"{i}.png", blob, temp_dir(folder))
    written = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    emit(
        args.out,
        {
            "kind": "phases",
            **setting,
            "call_s": round(call_s, 3),
            "encode_prompt_s": round(result.encode_s, 4),
            "denoise_s": round(result.denoise_s, 3),
            "unet_step_ms": round(1e3 * result.denoise_s / args.steps, 2),
            "vae_decode_s": round(result.decode_s, 3),
            "png_encode_s": round(encoded - started, 3),
            "png_write_s": round(written - encoded, 4),
            "png_kib": round(sum(map(len, blobs)) / len(blobs) / 1024),
            "s_per_img_pipeline": round(call_s / args.batch, 4),
            "s_per_img_with_save": round((call_s + written - started) / args.batch, 4),
        },
    )

    prof, kernels, by_kind, by_name = gpu_time(batch)
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    busy, idle, end = 0.0, 0.0, None
    for s, e in spans:  # union of kernel intervals; gaps between them are GPU idle
        if end is None or s > end:
            if end is not None:
                idle += s - end
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    total = sum(by_kind.values())
    emit(
        args.out,
        {
            "kind": "gpu_time",
            **setting,
            "kernel_ms": round(total / 1e3, 1),
            "busy_ms": round(busy / 1e3, 1),
            "idle_ms_between_kernels": round(idle / 1e3, 1),
            "kernels": len(kernels),
            "by_kind_pct": {k: round(100 * v / total, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[n, round(v / 1e3, 1)] for n, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]],
        },
    )
    trace = args.out.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(str(trace) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


if __name__ == "__main__":
    main()
