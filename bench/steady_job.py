"""Where a steady few-step job's time goes, with and without the writer beside it (issue 81).

The worker's own parts, no queue: ``WarmPipelines`` as ``worker launch`` builds it (its levers,
``--precision``, the job's ``--decoder``), one chunk a call as a job runs it, and the product's
``Folder.write_images`` (PNG encode in 8 threads, temp file, fsync, rename) of the previous
chunk on a thread of its own, as the worker's writer does. Phases, each ``--batches`` calls:

- ``bare``: calls back to back, nothing beside them;
- ``writer``: each call beside the previous chunk's write;
- ``threads<N>``, ``nice<N>``, ``procs<N>``: beside the same write by N threads, N threads at the
  lowest CPU priority, or N processes (which hold no GIL of the worker's);
- ``bare2``: bare again (a GPU that slowed under sustained load stays slow here too);
- ``<phase>-cat`` (``--cat-phases``): that phase with each batch's first latents drawn by diffusers'
  own ``randn_tensor`` (a ``torch.cat`` of one tensor per generator), as before 2026-12-04's
  ``worker/pipelines/noise.py``: the same numbers, the join it left out.

Then one call of each kind under ``torch.profiler``: kernel time by kind and the GPU's idle time
inside the call. The same kernels taking longer beside the writer is the GPU (clocks, memory),
more idle time between them is the host. ``--pixels`` times the decode's last step (device
rounding, copy to the host, PIL images) as the product does it against the strided copy it made
before 2026-12-04. Sample the GPU's clocks beside it with nvidia-smi (``bench/README.md``).

    python3 bench/steady_job.py --out $OUT/steady.jsonl --precision fp8 --decoder taesdxl-random
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_batch import gpu_time  # bench/, this script's own folder
from rank_profile import union_us

from common.jobspec import GenParams
from worker.output.destination import Folder
from worker.output.images import image_bytes, temp_dir, write_atomic
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


def _lowest_priority() -> None:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _encode_write(mode: str, size: tuple[int, int], data: bytes, record: dict[str, Any], folder: str) -> None:
    """In a writer process: the image from its bytes, then as ``Folder.write_images`` writes it."""
    from PIL import Image

    path = Path(folder) / record["file_name"]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, image_bytes(Image.frombytes(mode, size, data), record), temp_dir(Path(folder)))


def writers(folder: Path, names: list[str], stack: ExitStack) -> dict[str, Callable[..., None]]:
    """Each way of writing a chunk, by phase name: the product's (``writer``) and the variants."""

    def pooled(pool: Executor, as_process: bool) -> Callable[..., None]:
        def write(records: list[dict[str, Any]], images: list[Any]) -> None:
            if as_process:
                jobs = [pool.submit(_encode_write, im.mode, im.size, im.tobytes(), r, str(folder))
                        for r, im in zip(records, images, strict=True)]  # fmt: skip
            else:
                jobs = [pool.submit(_encode_write_here, r, im) for r, im in zip(records, images, strict=True)]
            for job in jobs:
                job.result()

        def _encode_write_here(record: dict[str, Any], image: Any) -> None:
            path = folder / record["file_name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, image_bytes(image, record), temp_dir(folder))

        return write

    made: dict[str, Callable[..., None]] = {"writer": Folder(folder).write_images}
    for name in names:
        n = int("".join(ch for ch in name if ch.isdigit()) or 8)
        if name.startswith("procs"):
            pool: Executor = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"))
            list(pool.map(abs, range(4 * n)))  # the processes started (and torch imported) before any phase
            made[name] = pooled(stack.enter_context(pool), as_process=True)
        elif name.startswith(("threads", "nice")):
            init = _lowest_priority if name.startswith("nice") else None
            made[name] = pooled(stack.enter_context(ThreadPoolExecutor(n, initializer=init)), as_process=False)
    return made


#: the main thread's parts, marked for the profiler
PARTS = ("encode_prompt", "scheduler.step", "decode", "to_pil", "prepare_latents")


@contextmanager
def marked(pipe: Any) -> Iterator[None]:
    """The pipeline's parts as ``record_function`` ranges: the GPU's idle gaps are put down to the
    part the main thread was in when each one ended (a UNet call is the time between steps)."""
    from torch.profiler import record_function

    from worker.pipelines.families import sdxl

    def wrap(call: Callable[..., Any], name: str) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            with record_function(name):
                return call(*args, **kwargs)

        return inner

    saved = {"decode": sdxl.decode, "to_pil": sdxl.to_pil}
    pipe.encode_prompt = wrap(pipe.encode_prompt, "encode_prompt")
    pipe.prepare_latents = wrap(pipe.prepare_latents, "prepare_latents")
    pipe.scheduler.step = wrap(pipe.scheduler.step, "scheduler.step")
    for name, call in saved.items():
        setattr(sdxl, name, wrap(call, name))
    try:
        yield
    finally:
        for attr in ("encode_prompt", "prepare_latents"):
            pipe.__dict__.pop(attr, None)
        pipe.scheduler.__dict__.pop("step", None)
        for name, call in saved.items():
            setattr(sdxl, name, call)


def gaps_by_part(prof: Any, kernels: list[Any]) -> dict[str, float]:
    """Milliseconds of GPU idle (gaps over 5 µs between kernels) by the marked part whose range
    holds the gap's end; ``unet`` where none does (the main thread was launching a UNet call)."""
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.name in PARTS]
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    by_part: dict[str, float] = defaultdict(float)
    end = spans[0][1]
    for start, stop in spans[1:]:
        if start - end > 5:
            # the innermost range: to_pil and decode before encode_prompt's wider ones
            holders = [(b - a, name) for a, b, name in ranges if a <= start <= b]
            by_part[min(holders)[1] if holders else "unet"] += start - end
        end = max(end, stop)
    return {k: round(v / 1e3, 1) for k, v in sorted(by_part.items(), key=lambda kv: -kv[1])}


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


@contextmanager
def diffusers_noise() -> Iterator[None]:
    """Inside: an SDXL batch's first latents are diffusers' draw (``randn_tensor`` over the list
    of generators, joined by ``torch.cat``), the numbers ``worker/pipelines/noise.py`` draws."""
    from diffusers.utils.torch_utils import randn_tensor

    from worker.pipelines.families import sdxl

    ours = sdxl.sdxl_latents

    def theirs(pipe: Any, width: int, height: int, generators: Any, dtype: Any, device: Any) -> Any:
        scale, channels = pipe.vae_scale_factor, pipe.unet.config.in_channels
        shape = (len(generators), channels, height // scale, width // scale)
        return randn_tensor(shape, generator=list(generators), device=device, dtype=dtype)

    sdxl.sdxl_latents = theirs
    try:
        yield
    finally:
        sdxl.sdxl_latents = ours


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
    ap.add_argument("--variants", default="threads3,nice8,procs8", help="writer variants, each a phase")
    ap.add_argument("--cat-phases", default="", help="phases run again with diffusers' noise draw (writer,bare)")
    args = ap.parse_args()
    import diffusers

    setting = {"precision": args.precision, "speedups": args.speedups, "decoder": args.decoder, "chunk": args.chunk,
               "steps": args.steps, "guidance": args.guidance}  # fmt: skip
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    emit(args.out, {"kind": "env", "gpu": gpu, "torch": torch.__version__,
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

    folder = args.folder = Path(tempfile.mkdtemp(prefix="diffq-steady-"))
    variants = [v for v in args.variants.split(",") if v]
    with ExitStack() as stack:
        writes = writers(folder, variants, stack)
        handoff = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffq-writer"))
        profiles = ("profile-bare", "profile-writer") if torch.cuda.is_available() else ()
        index = 1
        cats = [f"{p}-cat" for p in args.cat_phases.split(",") if p]
        for phase in ("bare", "writer", *variants, *cats, "bare2", *profiles):
            with diffusers_noise() if phase.endswith("-cat") else ExitStack():
                index = run_phase(args, warm, loaded, params, phase, index, writes, handoff, setting)
    shutil.rmtree(folder, ignore_errors=True)


def run_phase(args: argparse.Namespace, warm: WarmPipelines, loaded: Any, params: GenParams, phase: str, index: int,
              writes: dict[str, Callable[..., None]], handoff: Executor, setting: dict[str, Any]) -> int:  # fmt: skip
    """``--batches`` calls (two for a profile: the second one profiled), each beside the write of
    the one before where the phase writes; returns the next chunk's index."""
    write = writes.get(phase.removeprefix("profile-").removesuffix("-cat"))
    pending: Future[None] | None = None
    calls = 2 if phase.startswith("profile") else args.batches
    for i in range(calls):
        batch = chunk(params, args.chunk, index)
        index += 1
        profiled = phase.startswith("profile") and i == calls - 1
        began, t0 = time.time(), time.perf_counter()
        if profiled:
            box: dict[str, Any] = {}
            with marked(loaded.pipe):
                prof, kernels, by_kind, _ = gpu_time(lambda b=batch, out=box: out.update(r=warm.generate(loaded, b)[0]))
            result = box["r"]
        else:
            result, _ = warm.generate(loaded, batch)
        wall = time.perf_counter() - t0
        line = {"kind": "call", "phase": phase, "i": i, "began": round(began, 3), "wall_s": round(wall, 4),
                "encode_s": round(result.encode_s, 4), "denoise_s": round(result.denoise_s, 4),
                "decode_s": round(result.decode_s, 4),
                "writer_still_busy": pending is not None and not pending.done()}  # fmt: skip
        if profiled and kernels:
            line |= kernel_split(kernels) | {"by_kind_ms": {k: round(v / 1e3, 1) for k, v in by_kind.items()}}
            try:
                line["idle_ms_by_part"] = gaps_by_part(prof, kernels)
            except Exception as exc:  # the trace below still shows them
                line["idle_ms_by_part"] = repr(exc)
            trace = args.out.with_name(f"{args.out.stem}-{phase}.trace.json")
            prof.export_chrome_trace(str(trace))
            with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            trace.unlink()
        emit(args.out, line | setting)
        if pending is not None:
            t1 = time.perf_counter()
            pending.result()
            emit(args.out, {"kind": "wait_writer", "phase": phase, "i": i, "s": round(time.perf_counter() - t1, 4)})
            pending = None
        if write is not None:
            pending = handoff.submit(write, records(batch), result.images)
    if pending is not None:
        pending.result()
    if write is not None:
        emit(args.out, {"kind": "written", "phase": phase, "files": sum(1 for _ in Path(args.folder).rglob("*.png"))})
    return index


if __name__ == "__main__":
    main()
