"""Where a steady few-step job's time goes, with and without the writer beside it (issue 81).

The worker's own parts, no queue: ``WarmPipelines`` as ``worker launch`` builds it (its levers,
``--precision``, the job's ``--decoder``), one chunk a call as a job runs it, and the product's
``Folder.write_images`` (PNG encode in 8 threads, temp file, fsync, rename) of the previous
chunk on a thread of its own, as the worker's writer does. Phases, each ``--batches`` calls:

- ``bare``: calls back to back, nothing beside them;
- ``writer``: each call beside the previous chunk's write;
- ``bare2``: bare again (a GPU that slowed under sustained load stays slow here too).

Then one call of each kind under ``torch.profiler``: kernel time by kind and the GPU's idle time
inside the call. The same kernels taking longer beside the writer is the GPU (clocks, memory),
more idle time between them is the host. ``--pixels`` times the decode's last step (device
rounding, copy to the host, PIL images) as the product does it against the strided copy it made
before 2026-12-04. Sample the GPU's clocks beside it with nvidia-smi (``bench/README.md``).

    python3 bench/steady_job.py --out $OUT/steady.jsonl --precision fp8 --decoder taesdxl-random
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_batch import gpu_time  # bench/, this script's own folder
from rank_profile import union_us

from common.jobspec import GenParams
from worker.output.destination import Folder
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines

WORDS = ("cat", "teapot", "lamp", "fox", "boat", "tree", "house", "bird")


def emit(out: Path, record: dict[str, Any]) -> None:
    record = {"t": round(time.time(), 2), **record}
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def chunk(params: GenParams, size: int, index: int) -> Batch:
    prompts = [f"a photo of a {WORDS[i % 8]} number {index}-{i}, studio light" for i in range(size)]
    return Batch(params, prompts, [""] * size, [index * size + i for i in range(size)], size)


def records(batch: Batch) -> list[dict[str, Any]]:
    return [
        {"file_name": f"{seed // 1000:03d}/{seed}.png", "prompt": prompt, "seed": seed, "model": batch.params.model}
        for prompt, seed in zip(batch.prompts, batch.seeds, strict=True)
    ]


def kernel_split(prof_kernels: list[Any]) -> dict[str, float]:
    spans = [(e.time_range.start, e.time_range.end) for e in prof_kernels]
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    busy = union_us(spans)
    return {
        "kernel_ms": round(sum(e.device_time for e in prof_kernels) / 1e3, 1),
        "span_ms": round((last - first) / 1e3, 1),
        "busy_ms": round(busy / 1e3, 1),
        "idle_ms": round((last - first - busy) / 1e3, 1),
        "kernels": len(prof_kernels),
    }


def pixels_parts(out: Path, size: int) -> None:
    """The decode's last step on ``size`` decoded images: rounded on the device, then the
    host's copy laid out as the product lays it (contiguous before the copy) and as before."""
    from PIL import Image

    from worker.pipelines.pixels import rounded_pil

    image = torch.rand(size, 3, 1024, 1024, device="cuda", dtype=torch.float16)

    def strided() -> list[Any]:
        pixels = (image.float() * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
        return [Image.fromarray(p) for p in pixels]

    for name, call in (("strided", strided), ("product", lambda: rounded_pil(image))):
        times = []
        for _ in range(6):
            torch.cuda.synchronize()
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        emit(out, {"kind": "pixels", "layout": name, "images": size, "ms": round(1e3 * sorted(times[1:])[2], 1)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="sdxl-random", help="tiny: a smoke run on the CPU")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--speedups", default="auto")
    ap.add_argument("--decoder", default="taesdxl-random", help="the job's --decoder; none: the model's VAE")
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--guidance", type=float, default=0.0)
    ap.add_argument("--pixels", action="store_true", help="also time the decode's last step, both layouts")
    args = ap.parse_args()
    import diffusers

    setting = {"precision": args.precision, "speedups": args.speedups, "decoder": args.decoder, "chunk": args.chunk,
               "steps": args.steps, "guidance": args.guidance}  # fmt: skip
    emit(args.out, {"kind": "env", "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
                    "diffusers": diffusers.__version__, "commit": os.environ.get("BENCH_COMMIT", "unknown"),
                    "command": " ".join(sys.argv), **setting})  # fmt: skip
    if args.pixels:
        pixels_parts(args.out, args.chunk)
    started = time.perf_counter()
    warm = WarmPipelines(os.environ.get("DIFFQ_CACHE", "/tmp/diffq-cache"), speedups=args.speedups,
                         precision=args.precision)  # fmt: skip
    loaded, _ = warm.get(args.model)
    warm.use_decoder(loaded, None if args.decoder == "none" else args.decoder)
    params = GenParams(model=args.model, width=args.size, height=args.size, steps=args.steps, guidance=args.guidance,
                       sampler="euler", timestep_spacing="trailing")  # fmt: skip
    emit(args.out, {"kind": "load", **setting, "seconds": round(time.perf_counter() - started, 1)})
    started = time.perf_counter()
    warm.generate(loaded, chunk(params, args.chunk, 0))
    emit(args.out, {"kind": "warm_up", **setting, "seconds": round(time.perf_counter() - started, 1)})

    folder = Path(tempfile.mkdtemp(prefix="diffq-steady-"))
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffq-writer")
    index = 1
    profiles = ("profile-bare", "profile-writer") if torch.cuda.is_available() else ()
    for phase in ("bare", "writer", "bare2", *profiles):
        pending: Future[None] | None = None
        calls = 2 if phase.startswith("profile") else args.batches
        for i in range(calls):
            batch = chunk(params, args.chunk, index)
            index += 1
            profiled = phase.startswith("profile") and i == calls - 1
            began, t0 = time.time(), time.perf_counter()
            if profiled:
                box: dict[str, Any] = {}
                _, kernels, by_kind, _ = gpu_time(lambda b=batch: box.update(r=warm.generate(loaded, b)[0]))
                result = box["r"]
            else:
                result, _ = warm.generate(loaded, batch)
            wall = time.perf_counter() - t0
            writing = pending is not None and not pending.done()
            line = {"kind": "call", "phase": phase, "i": i, "began": round(began, 3), "wall_s": round(wall, 4),
                    "encode_s": round(result.encode_s, 4), "denoise_s": round(result.denoise_s, 4),
                    "decode_s": round(result.decode_s, 4), "writer_still_busy": writing}  # fmt: skip
            if profiled and kernels:
                line |= kernel_split(kernels) | {"by_kind_ms": {k: round(v / 1e3, 1) for k, v in by_kind.items()}}
            emit(args.out, line)
            if pending is not None:
                t1 = time.perf_counter()
                pending.result()
                if phase.endswith("writer"):
                    emit(args.out, {"kind": "wait_writer", "phase": phase, "i": i,
                                    "s": round(time.perf_counter() - t1, 4)})  # fmt: skip
                pending = None
            if phase.endswith("writer"):
                pending = writer.submit(Folder(folder).write_images, records(batch), result.images)
        if pending is not None:
            pending.result()
    writer.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
