"""CPU offload against GPU memory: img/s and peak memory per offload mode and memory cap.

For the mid-range GPU issue: what a worker can do on an 8, 12, 16 or 24 GB GPU. Memory is capped
per process (``torch.cuda.set_per_process_memory_fraction``) on one big GPU. For each mode
(``none``: the pipeline on the GPU; ``model``: diffusers' ``enable_model_cpu_offload``;
``sequential``: ``enable_sequential_cpu_offload``) and each cap, the largest batch of
``--batches`` that runs (an OOM tries the next smaller one), timed once after a short warm-up,
with its peak memory. The plain diffusers pipeline on ``sdxl-random`` (full SDXL, random
weights), fp16, 30 steps, CFG 5. One JSON line per measurement, written as soon as it is taken.

    python3 bench/offload.py --out $OUT/offload.jsonl --caps 24,16,12,8 --budget-s 480
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

from worker.pipelines.models import sdxl_random

PROMPT = "a lighthouse on a cliff at dusk, oil painting"


def emit(path: Path, line: dict) -> None:
    print(json.dumps(line), flush=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def run(pipe, batch: int, size: int, steps: int) -> None:
    pipe(prompt=[PROMPT] * batch, num_inference_steps=steps, guidance_scale=5.0, width=size, height=size,
         generator=torch.Generator("cpu").manual_seed(0))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--caps", default="24,16,12,8", help="GB")
    ap.add_argument("--modes", default="none,model,sequential")
    ap.add_argument("--batches", default="8,4,2,1")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--small-size", type=int, default=512, help="also measured at the smallest cap (0: not)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per cell after the first (median)")
    ap.add_argument(
        "--compile",
        choices=["", "fullgraph", "breaks"],
        default="",
        help="torch.compile the UNet after the offload hooks are on (fullgraph, or allowing graph breaks)",
    )
    args = ap.parse_args()
    began = time.monotonic()
    total = torch.cuda.get_device_properties(0).total_memory
    import diffusers

    emit(args.out, {"kind": "env", "gpu": torch.cuda.get_device_name(0), "total_gb": round(total / 2**30, 1),
                    "torch": torch.__version__, "diffusers": diffusers.__version__})  # fmt: skip
    built = time.perf_counter()
    pipe = sdxl_random("cuda", torch.float16)  # random init is fast on the GPU; offload modes move it
    pipe.set_progress_bar_config(disable=True)
    # decode in fp16, as the worker's default vae-fp16 lever does; diffusers' fp32 upcast is also
    # left in place by an OOM inside decode, which breaks every later call
    pipe.vae.register_to_config(force_upcast=False)
    emit(args.out, {"kind": "build", "seconds": round(time.perf_counter() - built, 1)})
    caps = [float(c) for c in args.caps.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    for mode in args.modes.split(","):
        torch.cuda.set_per_process_memory_fraction(1.0)
        if mode == "none":
            pipe.to("cuda")
        elif mode == "model":
            pipe.to("cpu")
            pipe.enable_model_cpu_offload()
        else:
            pipe.remove_all_hooks()
            pipe.to("cpu")
            pipe.enable_sequential_cpu_offload()
        torch.cuda.empty_cache()
        if args.compile:
            pipe.unet.compile(fullgraph=args.compile == "fullgraph", dynamic=False)
        warm = time.perf_counter()
        try:
            # the compile happens here, at the batch the cells run (a graph per batch size)
            run(pipe, batches[0] if args.compile else 1, args.size, 2)
        except Exception as exc:  # a fullgraph compile that cannot trace the offload hooks
            emit(args.out, {"kind": "warmup", "mode": mode, "compile": args.compile, "error": f"{type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}"})  # fmt: skip
            continue
        emit(args.out, {"kind": "warmup", "mode": mode, "compile": args.compile,
                        "seconds": round(time.perf_counter() - warm, 1),
                        "resident_gb": round(torch.cuda.memory_allocated() / 2**30, 2)})  # fmt: skip
        order = sorted(caps) if mode == "sequential" else caps  # sequential is slow: the small caps first
        sizes = [(cap, args.size) for cap in order] + ([(min(caps), args.small_size)] if args.small_size else [])
        for cap, size in sizes:
            if time.monotonic() - began > args.budget_s:
                emit(args.out, {"kind": "skipped", "mode": mode, "cap_gb": cap, "size": size, "why": "budget"})
                continue
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total))
            ran = None
            for batch in batches if mode != "sequential" else [b for b in batches if b <= 2]:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                try:
                    start = time.perf_counter()
                    run(pipe, batch, size, args.steps)
                    torch.cuda.synchronize()
                    seconds = time.perf_counter() - start
                except torch.OutOfMemoryError:
                    continue
                times = [seconds]
                for _ in range(args.repeats - 1):
                    start = time.perf_counter()
                    run(pipe, batch, size, args.steps)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
                seconds = statistics.median(times)
                ran = {"batch": batch, "s_per_img": round(seconds / batch, 3), "img_per_s": round(batch / seconds, 3),
                       "runs_s": [round(t, 2) for t in times],
                       "peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)}  # fmt: skip
                break
            emit(args.out, {"kind": "offload", "mode": mode, "compile": args.compile, "cap_gb": cap, "size": size,
                            "steps": args.steps,
                            **(ran or {"runs": False})})  # fmt: skip


if __name__ == "__main__":
    main()
