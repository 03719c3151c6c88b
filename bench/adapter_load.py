"""What an adapter's first job pays: load and merge, timed apart, three ways of loading.

For goal 4 of the throughput issue (the first job of a new adapter within 1.2x of a steady
job). The worker's first use of an adapter is ``pipe.load_lora_weights`` (PEFT wraps every
target layer and loads the adapter's tensors) and then the merge into the base weights
(:class:`worker.pipelines.adapters.MergedAdapters`). This times both on the worker's own
code, for each adapter, with the adapter removed again between tries, and compares how the
tensors reach PEFT:

- ``path``: the file's path, as the worker has done (safetensors read into CPU memory; PEFT
  moves and casts each of the ~1,100 tensors on its own);
- ``device``: the file read straight onto the GPU (``safetensors.torch.load_file(device=)``),
  the dict handed to ``load_lora_weights``;
- ``device-dtype``: the same, floating tensors cast to the pipeline's dtype first;
- ``direct``: no PEFT: the tensors read by :mod:`worker.pipelines.adapter_weights` and merged
  by it (the worker's way since 2026-11-25 for a plain LoRA or DoRA); "read" is the reading,
  "load" nothing, "merge" the merge.

One cProfile of the ``path`` load per adapter goes to ``--profile`` (top functions by own
time), to say where what is left goes.

    python3 bench/make_adapters.py /tmp/adapters
    python3 bench/adapter_load.py --out $OUT/adapter-load.jsonl --profile $OUT/adapter-profile.txt \
        --adapters lora=/tmp/adapters/lora,dora=/tmp/adapters/dora --repeats 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.offload import emit
from worker.pipelines import adapter_weights, fp8
from worker.pipelines.adapter_weights import AdapterWeights
from worker.pipelines.adapters import MergedAdapters
from worker.pipelines.models import ensure_tiny, sdxl_random

WAYS = ("path", "device", "device-dtype", "direct")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def source(pipe: Any, folder: Path, way: str) -> Any:
    """What ``load_lora_weights`` is given for ``way``."""
    if way == "path":
        return str(folder)
    from safetensors.torch import load_file

    device = pipe.unet.device
    tensors = load_file(str(next(folder.glob("*.safetensors"))), device=str(device))
    if way == "device-dtype":
        dtype = pipe.unet.dtype  # once: the property walks every parameter of the UNet
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    return tensors


#: seconds spent in adapter_weights.moved (the tensors to the GPU) during the last read
MOVED: list[float] = []
_moved = adapter_weights.moved


def _moved_host_cat(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """The first version of ``moved`` (2026-11-26): one ``torch.cat`` on the host, then one copy."""
    if not tensors:
        return []
    flat = torch.cat([t.reshape(-1) for t in tensors]).to(device).to(dtype)
    pieces = flat.split([t.numel() for t in tensors])
    return [piece.view(t.shape) for piece, t in zip(pieces, tensors, strict=True)]


HOST_CAT: list[bool] = []


def _timed_moved(*args: Any, **kwargs: Any) -> Any:
    started = time.perf_counter()
    out = (_moved_host_cat if HOST_CAT else _moved)(*args, **kwargs)
    sync()
    MOVED.append(time.perf_counter() - started)
    return out


def writer(images: int) -> threading.Thread:
    """What runs beside a worker's next job: the job before's PNGs encoded in a thread
    (:func:`worker.output.images.image_bytes`, 1024² noise, as the worker's writer does)."""
    from PIL import Image

    from worker.output.images import image_bytes

    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 255, (1024, 1024, 3), dtype=np.uint8)) for _ in range(images)]
    thread = threading.Thread(target=lambda: [image_bytes(p, {"prompt": "x"}) for p in pictures], daemon=True)
    return thread


def once(
    pipe: Any, name: str, folder: Path, way: str, profile: cProfile.Profile | None = None, beside: int = 0
) -> dict[str, float]:
    """One first use of the adapter, as the worker's ``use_adapter`` does it, then removed again.
    For ``direct`` the parts are timed too: the file alone (``lora_state_dict``), a second merge
    once the pristine copies exist (what a switch pays), and the FP8 weights' refresh."""
    merged = MergedAdapters(pipe)
    parts: dict[str, float] = {}
    thread = writer(beside) if beside else None
    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    sync()
    if thread is not None:
        thread.start()
        time.sleep(0.05)  # the writer is encoding before anything is timed
    if way == "direct":
        t = time.perf_counter()
        pipe.lora_state_dict(str(folder), return_lora_metadata=True)
        parts["state_dict_s"] = time.perf_counter() - t
    MOVED.clear()
    t0 = time.perf_counter()
    given = adapter_weights.read(pipe, folder, None) if way == "direct" else source(pipe, folder, way)
    sync()
    t1 = time.perf_counter()
    if MOVED:
        parts["moved_s"] = sum(MOVED)
    if profile:
        profile.enable()
    if way == "direct":
        assert isinstance(given, AdapterWeights), given  # the reason it would take PEFT's way
        merged.direct[name] = given
    else:
        pipe.load_lora_weights(given, adapter_name=name)
        merged.peft.add(name)
    sync()
    if profile:
        profile.disable()
    t2 = time.perf_counter()
    merged.use(name, 1.0)
    sync()
    t3 = time.perf_counter()
    if thread is not None:
        thread.join()
    if stats:  # new blocks of device memory and the allocator's free-and-retry passes during the first use
        after = torch.cuda.memory_stats()
        for key in ("num_device_alloc", "num_alloc_retries"):
            parts[key] = after.get(key, 0) - stats.get(key, 0)
    if way == "direct":
        if any(True for _ in fp8.layers(pipe)):
            fp8.refresh(pipe)
            sync()
            parts["refresh_s"] = time.perf_counter() - t3
        merged.restore()
        sync()
        t = time.perf_counter()
        merged.use(name, 1.0)
        sync()
        parts["switch_merge_s"] = time.perf_counter() - t
    # the merged weights, summed: the ways must agree on them (the same adapter, merged alike)
    weights = [base.weight for base, _ in merged._pristine.values()]  # every layer the merge changed
    checksum = float(torch.stack([w.float().abs().sum() for w in weights]).sum())
    merged.restore()
    if way != "direct":
        pipe.unload_lora_weights()
    sync()
    times = {"read_s": t1 - t0, "load_s": t2 - t1, "merge_s": t3 - t2, "first_use_s": t3 - t0}
    return {**times, **parts, "checksum": checksum}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--adapters", required=True, help="name=folder,name=folder")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--model", choices=["sdxl-random", "tiny"], default="sdxl-random", help="tiny: a CPU smoke run")
    ap.add_argument("--after-batch", type=int, default=0, help="N: one 2-step 1024² batch of N images first")
    ap.add_argument("--beside-writer", type=int, default=0, help="N: a thread encodes N 1024² PNGs meanwhile")
    ap.add_argument("--host-cat", action="store_true", help="the adapter's tensors joined on the host (the old way)")
    ap.add_argument("--switch-interval", type=float, help="sys.setswitchinterval, seconds (Python's default 0.005)")
    ap.add_argument("--fp8", action="store_true", help="the UNet's linears as FP8 layers (scale 1: timing only)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    adapter_weights.moved = _timed_moved  # the read's tensors-to-GPU step timed on its own
    if args.host_cat:
        HOST_CAT.append(True)
    started = time.perf_counter()
    if args.model == "tiny":
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline.from_pretrained(ensure_tiny("/tmp/diffq-bench-cache"), torch_dtype=dtype)
    else:
        pipe = sdxl_random(device, dtype)
    if args.fp8:
        unet = fp8.denoiser(pipe)
        fp8.quantize(pipe, {n: 1.0 for n, m in unet.named_modules() if fp8.candidate(n, m)})
    sync()
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    import diffusers
    import peft

    base = {"gpu_name": gpu, "torch": torch.__version__, "diffusers": diffusers.__version__, "peft": peft.__version__}
    emit(args.out, {**base, "kind": "build", "seconds": round(time.perf_counter() - started, 2)})
    adapters = dict(item.split("=", 1) for item in args.adapters.split(","))
    ways = args.ways.split(",")
    first = next(iter(adapters.items()))
    if args.after_batch:  # the allocator's cache as a worker's is after a job: full of the batch's activations
        from common.jobspec import GenParams
        from worker.pipelines.generate import run_batch

        n = args.after_batch
        params = GenParams(model="sdxl-random", width=1024, height=1024, steps=2, guidance=5.0)
        run_batch(pipe, params, prompts=["a fox"] * n, negatives=[""] * n, seeds=list(range(n)))
    else:
        once(pipe, "warmup", Path(first[1]), "path")  # CUDA kernels and PEFT's imports, not an adapter's cost
    for name, folder in adapters.items():
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
        for _ in range(args.repeats):
            for way in ways:  # interleaved, so a drift in the machine hits each way alike
                runs[way].append(once(pipe, name, Path(folder), way, beside=args.beside_writer))
        for way, times in runs.items():
            line = {**base, "kind": "adapter-first-use", "adapter": name, "way": way, "repeats": len(times)}
            line["fp8"] = args.fp8
            line["beside_writer"] = args.beside_writer
            line["switch_interval"] = sys.getswitchinterval()
            line["moved"] = "host-cat" if HOST_CAT else "device-cat"
            for key in times[0]:
                line[key] = round(statistics.median(t[key] for t in times), 4)
            line["checksum"] = times[0]["checksum"]
            line["first_use_all_s"] = [round(t["first_use_s"], 3) for t in times]
            emit(args.out, line)
        if args.profile:
            profile = cProfile.Profile()
            once(pipe, name, Path(folder), "path", profile)
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            text.write(f"== {name}: load_lora_weights(path), by own time\n")
            stats.sort_stats("tottime").print_stats(18)
            text.write(f"== {name}: by cumulative time\n")
            stats.sort_stats("cumulative").print_stats(30)
            with open(args.profile, "a", encoding="utf-8") as out:
                out.write(text.getvalue())


if __name__ == "__main__":
    main()
