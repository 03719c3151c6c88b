"""Where a compiled UNet step's time goes by region, and what compiling more of it buys.

The defaults compile SDXL's repeated transformer blocks and its ResNet blocks (regional
compile); everything between them runs eagerly: each ``Transformer2DModel``'s GroupNorm,
permutes and projections, the skip concatenations, the up/down samplers. This script times each
region of one UNet call with CUDA events (no sync inside the call), eager and with the default
levers, then times the alternatives on the same weights: the whole UNet as one graph, and the
VAE decoder compiled (one graph, or region by region). Each stage reports its first-call time
(the compile) and its steady time, and its largest pixel-scale difference against eager.

    python3 bench/regions.py --out $OUT/regions.jsonl --budget-s 420
    python3 bench/regions.py --out /tmp/r.jsonl --model tiny --device cpu     # a quick check here
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STARTED = time.perf_counter()


def emit(out: Path, record: dict) -> None:
    record = {"t": round(time.time(), 1), "elapsed_s": round(time.perf_counter() - STARTED, 1), **record}
    with out.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


class Timer:
    """CUDA events around calls, read after one sync at the end of the UNet call."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[str, Any, Any]] = []
        self.totals: dict[str, float] = defaultdict(float)

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def add(self, name: str, start: Any, end: Any) -> None:
        self.pending.append((name, start, end))

    def collect(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        for name, start, end in self.pending:
            self.totals[name] += start.elapsed_time(end) if self.cuda else 1e3 * (end - start)
        self.pending.clear()


class Timed(torch.nn.Module):
    """Wraps one region of the UNet; not compiled itself, so the events stay outside graphs."""

    def __init__(self, inner: torch.nn.Module, name: str, timer: Timer) -> None:
        super().__init__()
        self.inner, self.region, self.timer = inner, name, timer

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not TIMING[0]:
            return self.inner(*args, **kwargs)
        start = self.timer.mark()
        out = self.inner(*args, **kwargs)
        self.timer.add(self.region, start, self.timer.mark())
        return out


TIMING = [False]


def wrap_regions(unet: torch.nn.Module, timer: Timer) -> None:
    """Wrap transformer blocks, ResNet blocks, whole Transformer2DModels and samplers in place."""
    from diffusers.models.attention import BasicTransformerBlock
    from diffusers.models.resnet import Downsample2D, ResnetBlock2D, Upsample2D
    from diffusers.models.transformers.transformer_2d import Transformer2DModel

    kinds = {
        BasicTransformerBlock: "blocks",
        ResnetBlock2D: "resnets",
        Transformer2DModel: "transformer2d",
        Upsample2D: "samplers",
        Downsample2D: "samplers",
    }
    for parent in list(unet.modules()):
        for child_name, child in list(parent.named_children()):
            kind = kinds.get(type(child))
            if kind is not None:
                setattr(parent, child_name, Timed(child, kind, timer))


def unet_inputs(unet: torch.nn.Module, batch: int, size: int, device: torch.device) -> dict[str, Any]:
    g = torch.Generator(device="cpu").manual_seed(0)
    dtype = unet.dtype
    h = size // 8
    cross = unet.config.cross_attention_dim
    pooled = unet.config.projection_class_embeddings_input_dim - 6 * unet.config.addition_time_embed_dim

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device, dtype)

    return {
        "sample": rnd(batch, 4, h, h),
        "timestep": torch.tensor(500.0, device=device),
        "encoder_hidden_states": rnd(batch, 77, cross),
        "added_cond_kwargs": {
            "text_embeds": rnd(batch, pooled),
            "time_ids": torch.tensor([[size, size, 0, 0, size, size]] * batch, device=device, dtype=dtype),
        },
        "return_dict": False,
    }


def timed_calls(fn: Callable[[], Any], repeats: int, device: torch.device) -> tuple[float, list[float], Any]:
    """First call (compile, if any) and steady calls, in ms; returns the last output too."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    sync()
    started = time.perf_counter()
    out = fn()
    sync()
    first = 1e3 * (time.perf_counter() - started)
    fn()  # a second call: any autotuning or second-shape compile
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        out = fn()
        sync()
        times.append(1e3 * (time.perf_counter() - started))
    return first, times, out


def pixel_diff(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Largest and mean difference on the 0..255 scale of images in [-1, 1]."""
    d = (a.float() - b.float()).abs() * 127.5
    return {"max_255": round(d.max().item(), 3), "mean_255": round(d.mean().item(), 4)}


def output_diff(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Largest difference of two UNet outputs, and relative to the reference's largest value."""
    d = (a.float() - b.float()).abs().max().item()
    return {"max_abs": round(d, 5), "max_rel": round(d / b.float().abs().max().item(), 6)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="sdxl-random", choices=["sdxl-random", "tiny"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=8, help="images; the UNet sees twice as many (CFG)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--stages", default="regions,whole,vae", help="which of regions, whole, vae")
    args = ap.parse_args()
    import diffusers

    from common.settings import point_compile_cache_at
    from worker.pipelines import models

    point_compile_cache_at(str(Path("/tmp/diffq-regions-cache")))
    torch.compiler.config.job_id = "diffq-regions"
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    stages = set(args.stages.split(","))
    env = {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "model": args.model,
        "dtype": str(dtype).removeprefix("torch."),
        "batch": args.batch,
        "unet_batch": 2 * args.batch,
        "size": args.size,
    }
    emit(args.out, {"kind": "env", **env})
    if args.model == "tiny":
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline.from_pretrained(models.ensure_tiny("/tmp/diffq-regions-cache"))
        pipe.to(device, dtype)
    else:
        pipe = models.sdxl_random(device, dtype)
    unet, vae = pipe.unet, pipe.vae
    eager_unet = copy.deepcopy(unet) if "whole" in stages else None
    inputs = unet_inputs(unet, 2 * args.batch, args.size, device)
    timer = Timer(device)
    wrap_regions(unet, timer)

    def unet_call() -> torch.Tensor:
        with torch.inference_mode():
            return unet(**inputs)[0]

    def regions_record(label: str, first_ms: float, times: list[float]) -> dict:
        TIMING[0] = True
        timer.totals.clear()
        for _ in range(args.repeats):
            unet_call()
            timer.collect()
        TIMING[0] = False
        total = statistics.median(times)
        per = {k: v / args.repeats for k, v in timer.totals.items()}
        t2d_outside = per.get("transformer2d", 0.0) - per.get("blocks", 0.0)
        outside = total - per.get("transformer2d", 0.0) - per.get("resnets", 0.0) - per.get("samplers", 0.0)
        return {
            "kind": "unet",
            "config": label,
            **env,
            "first_call_ms": round(first_ms, 1),
            "step_ms": round(total, 2),
            "step_ms_all": [round(t, 1) for t in times],
            "blocks_ms": round(per.get("blocks", 0.0), 2),
            "resnets_ms": round(per.get("resnets", 0.0), 2),
            "transformer2d_outside_blocks_ms": round(t2d_outside, 2),
            "samplers_ms": round(per.get("samplers", 0.0), 2),
            "rest_of_unet_ms": round(outside, 2),
        }

    # 1. Eager, region by region
    first, times, eager_out = timed_calls(unet_call, args.repeats, device)
    emit(args.out, regions_record("eager", first, times))

    # 2. The regional compile (the repeated blocks), region by region
    if "regions" in stages:
        from worker.pipelines.speedups import Speedups, apply

        apply(pipe, Speedups(frozenset({"compile-blocks"})))
        first, times, out = timed_calls(unet_call, args.repeats, device)
        emit(args.out, regions_record("compile-blocks", first, times) | output_diff(out, eager_out))

    # 3. The VAE decoder: eager, one graph, region by region
    if "vae" in stages and time.perf_counter() - STARTED < args.budget_s * 0.5:
        latents = torch.randn(args.batch, 4, args.size // 8, args.size // 8, generator=torch.Generator().manual_seed(1))
        latents = latents.to(device, vae.dtype)

        def decode() -> torch.Tensor:
            with torch.inference_mode():
                return vae.decode(latents, return_dict=False)[0]

        first, times, ref = timed_calls(decode, max(2, args.repeats // 2), device)
        emit(
            args.out,
            {
                "kind": "decode",
                "config": "eager",
                **env,
                "first_call_ms": round(first, 1),
                "decode_ms": round(statistics.median(times), 1),
            },
        )
        if device.type == "cuda":
            emit(args.out, {"kind": "decode_kernels", "config": "eager", **env, "top": top_kernels(decode)})
        pristine = vae.decoder
        for label in ("decoder fullgraph", "decoder regional"):
            if time.perf_counter() - STARTED > args.budget_s * 0.55:
                break
            torch._dynamo.reset()
            vae.decoder = copy.deepcopy(pristine)
            if label == "decoder fullgraph":
                vae.decoder.compile(fullgraph=True)
            else:
                compile_decoder_regions(vae.decoder)
            first, times, out = timed_calls(decode, max(2, args.repeats // 2), device)
            emit(
                args.out,
                {
                    "kind": "decode",
                    "config": label,
                    **env,
                    "first_call_ms": round(first, 1),
                    "decode_ms": round(statistics.median(times), 1),
                }
                | pixel_diff(out, ref),
            )
            if device.type == "cuda" and label == "decoder fullgraph":
                emit(args.out, {"kind": "decode_kernels", "config": label, **env, "top": top_kernels(decode)})

    # 4. The whole UNet as one graph (last: its cold compile is the longest), on the same weights
    if "whole" in stages and eager_unet is not None and time.perf_counter() - STARTED < args.budget_s * 0.6:
        del unet
        pipe.unet = None
        torch._dynamo.reset()
        whole = torch.compile(eager_unet, fullgraph=True)

        def whole_call() -> torch.Tensor:
            with torch.inference_mode():
                return whole(**inputs)[0]

        first, times, out = timed_calls(whole_call, args.repeats, device)
        emit(
            args.out,
            {
                "kind": "unet",
                "config": "whole-unet fullgraph",
                **env,
                "first_call_ms": round(first, 1),
                "step_ms": round(statistics.median(times), 2),
                "step_ms_all": [round(t, 1) for t in times],
            }
            | output_diff(out, eager_out),
        )
        del whole, eager_unet


def compile_decoder_regions(decoder: torch.nn.Module) -> None:
    """Each ResNet block, the mid-block and each upsampler of the decoder, compiled on its own."""
    from diffusers.models.resnet import ResnetBlock2D, Upsample2D

    for module in decoder.modules():
        if isinstance(module, ResnetBlock2D | Upsample2D):
            module.compile(fullgraph=True)
    for attention in decoder.mid_block.attentions:
        attention.compile(fullgraph=True)
    decoder.conv_norm_out.compile()


def top_kernels(fn: Callable[[], Any], n: int = 12) -> list:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name[:120]] += e.device_time
    return [[name, round(us / 1e3, 2)] for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:n]]


if __name__ == "__main__":
    main()
