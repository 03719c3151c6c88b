"""FP8 against fp16 inside the denoiser: the output's relative error at every step of one
denoise (the fp8 model run on the fp16 trajectory's own inputs, so errors do not compound),
and one compiled call's time per scale granularity (per-tensor, per-row) at a batch size.

    python bench/fp8_unet.py --out r.jsonl --error-prompts 4            # per-step error
    python bench/fp8_unet.py --out r.jsonl --time fp16,tensor,row --batch 8   # compiled call times
    python bench/fp8_unet.py --out r.jsonl --time tensor-linears,tensor      # convolutions fp16 / FP8
    python bench/fp8_unet.py --out r.jsonl --time tensor,tensor@mk           # compiler settings (INDUCTOR)
    python bench/fp8_unet.py --out r.jsonl --time tensor,tensor@empty        # the empty-negative lever

Scales come from the worker's store (``DIFFQ_CACHE``), as a worker would find them after a run
with ``--precision fp8``, or are calibrated here the worker's way (worker/pipelines/fp8.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch._inductor.config

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common.settings import Settings
from worker.pipelines import empty_negative, fp8, models, reductions

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}

#: compiler settings a variant may name after "@" (``tensor@mk``): experiments on the
#: normalization and elementwise kernels the compiler writes, a third of an FP8 UNet call
INDUCTOR = {
    # both a persistent (one read of each row) and a looped reduction for every reduction up to
    # 16x the usual 1024 elements (LayerNorm over 1280 channels is looped by default), timed at the
    # first call and the faster kept
    "mk": {"triton.multi_kernel": 1},
    # each generated kernel's launch configuration tuned by coordinate descent
    "cdt": {"coordinate_descent_tuning": True},
    # rows up to 2048 elements reduced in one pass (the worker's ``persistent-norms`` lever,
    # worker/pipelines/reductions.py): not a config setting, so applied by hand below
    "persist": {},
    # the empty negative prompt's rows skip cross-attention (the worker's ``empty-negative``
    # lever, worker/pipelines/empty_negative.py): applied by hand below too
    "empty": {},
}


def load(model: str, dtype: torch.dtype) -> Any:
    device = torch.device("cuda")
    pipe = models.flux_random(device, dtype) if model == "flux-random" else models.sdxl_random(device, dtype)
    pipe.set_progress_bar_config(disable=True)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.requires_grad_(False)
    return pipe


def scales_for(pipe: Any, model: str) -> tuple[dict[str, float], str]:
    """The worker's own calibration of ``pipe``, from the store a worker run left (DIFFQ_CACHE)."""
    return fp8.scales(pipe, model, fp8.ScaleStore(Path(Settings.load().cache_dir)))


def quantized_copy(pipe: Any, scales: dict[str, float], granularity: str) -> torch.nn.Module:
    """A copy of the denoiser in FP8 at ``granularity`` (``tensor``, ``row``) as the worker makes
    it; ``-fastacc``: every linear with cuBLAS's fast accumulation, ``-slowacc``: none; ``-act8`` /
    ``-act16``: GEGLU's input written in FP8 / fp16 (``DIFFQ_FP8_ACTIVATIONS``; the worker's
    default without either); ``-erf`` / ``-tanh``: GEGLU's GELU exact / in its tanh form where its
    input is FP8 (``fp8.FAST_GELU``)."""
    name = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    copied = SimpleNamespace(**{name: copy.deepcopy(getattr(pipe, name))})
    base, *flags = granularity.split("-")
    accumulate = next((f for f in flags if f.endswith("acc")), "")
    before = os.environ.get("DIFFQ_FP8_ACTIVATIONS")
    for flag, value in (("act8", "1"), ("act16", "0")):
        if flag in flags:
            os.environ["DIFFQ_FP8_ACTIVATIONS"] = value
    fast_gelu = fp8.FAST_GELU
    fp8.FAST_GELU = {"erf": False, "tanh": True}.get(next((f for f in flags if f in ("erf", "tanh")), ""), fast_gelu)
    try:
        count = fp8.quantize(copied, scales, base)
    finally:
        fp8.FAST_GELU = fast_gelu
        os.environ.pop("DIFFQ_FP8_ACTIVATIONS", None)
        if before is not None:
            os.environ["DIFFQ_FP8_ACTIVATIONS"] = before
    for layer in getattr(copied, name).modules():
        if isinstance(layer, fp8.StaticFP8Linear) and accumulate:
            layer.fast_accum = accumulate == "fastacc"
    print(f"{granularity}: {count} linears in FP8", flush=True)
    return getattr(copied, name)


@torch.no_grad()
def step_errors(pipe: Any, quantized: torch.nn.Module, prompts: int, steps: int) -> list[float]:
    """Relative L2 error of the fp8 model's output against fp16's, per step, on fp16's inputs."""
    name = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    model = getattr(pipe, name)
    original = model.forward
    errors: list[list[float]] = []

    def both(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        ours = quantized(*args, **kwargs)
        want = (out[0] if isinstance(out, tuple) else out.sample).float()
        got = (ours[0] if isinstance(ours, tuple) else ours.sample).float()
        errors.append([float((g - w).norm() / w.norm()) for g, w in zip(got, want, strict=True)])
        return out

    model.forward = both
    try:
        pipe(
            prompt=[f"{p} {i}" for i, p in enumerate(fp8.CALIBRATION_PROMPTS[::-1][:prompts])],
            num_inference_steps=steps,
            guidance_scale=5.0,
            generator=[torch.Generator("cpu").manual_seed(1000 + i) for i in range(prompts)],
            output_type="latent",
        )
    finally:
        del model.forward
    return [round(sum(e) / len(e), 5) for e in errors]


def unet_inputs(batch: int, dtype: torch.dtype, zero_rows: int = 0) -> tuple[tuple, dict]:
    """A CFG batch as SDXL's pipeline makes it for an empty negative prompt: the first half's
    text states are zero; ``zero_rows`` says so to the ``empty-negative`` processors."""
    device = torch.device("cuda")
    rows = 2 * batch  # CFG
    sample = torch.randn(rows, 4, 128, 128, device=device, dtype=dtype)
    text = torch.randn(rows, 77, 2048, device=device, dtype=dtype)
    text[:batch] = 0
    added = {
        "text_embeds": torch.randn(rows, 1280, device=device, dtype=dtype),
        "time_ids": torch.tensor([[1024, 1024, 0, 0, 1024, 1024]] * rows, device=device, dtype=dtype),
    }
    t = torch.tensor(500, device=device)
    kwargs = {"encoder_hidden_states": text, "added_cond_kwargs": added, "return_dict": False}
    if zero_rows:
        kwargs["cross_attention_kwargs"] = {empty_negative.ZERO_ROWS: zero_rows}
    return (sample, t), kwargs


@torch.no_grad()
def call_time(
    module: torch.nn.Module,
    batch: int,
    dtype: torch.dtype,
    repeats: int = 10,
    profile: bool = False,
    zero_rows: int = 0,
) -> dict[str, Any]:
    args, kwargs = unet_inputs(batch, dtype, zero_rows)
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    started = time.perf_counter()
    compiled(*args, **kwargs)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - started
    for _ in range(2):
        compiled(*args, **kwargs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        compiled(*args, **kwargs)
    end.record()
    torch.cuda.synchronize()
    timing = {"compile_s": round(compile_s, 1), "call_ms": round(start.elapsed_time(end) / repeats, 2)}
    if profile:
        timing |= kernel_times(lambda: compiled(*args, **kwargs))
    return timing


def kernel_times(call: Any, calls: int = 2) -> dict[str, Any]:
    """GPU kernel time of one call by kind (bench/rank_profile.py's names) and its top kernels."""
    from rank_profile import kind_of  # bench/, this script's own folder

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    by_name: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.self_device_time_total > 0:
            by_name[event.key] = by_name.get(event.key, 0.0) + event.self_device_time_total / 1000 / calls
    kinds: dict[str, float] = {}
    for name, ms in by_name.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + ms
    top = sorted(by_name.items(), key=lambda item: -item[1])[:15]
    return {
        "kernel_ms": round(sum(by_name.values()), 2),
        "kinds_ms": {k: round(v, 2) for k, v in sorted(kinds.items(), key=lambda item: -item[1])},
        "top_ms": [[name[:90], round(ms, 2)] for name, ms in top],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="sdxl-random")
    ap.add_argument("--dtype", default="float16", choices=list(DTYPES))
    ap.add_argument("--error-prompts", type=int, default=0, help="per-step error over this many prompts (0: skip)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument(
        "--granularity",
        default="tensor",
        help="for the per-step error (tensor, row; -fastacc -slowacc -act8 -act16 -erf -tanh)",
    )
    ap.add_argument(
        "--time",
        default="",
        help="compiled UNet call time of these: fp16,tensor,row (-linears: fp16 convolutions; "
        "-fastacc / -slowacc: fast FP8 accumulation on every linear / none; "
        "-act8 / -act16: GEGLU's input in FP8 / fp16; -erf / -tanh: its GELU exact / tanh form; "
        f"@{'+'.join(INDUCTOR)}: compiler settings)",
    )
    ap.add_argument("--batch", type=int, default=8, help="images per call (CFG doubles the rows)")
    ap.add_argument("--profile", action="store_true", help="with --time: kernel time by kind, top kernels")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    pipe = load(args.model, dtype)
    scales, source = scales_for(pipe, args.model)
    base = {
        "kind": "fp8_unet",
        "model": args.model,
        "dtype": args.dtype,
        "gpu_name": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "scales": source,
        "fp8_layers": len(scales),
    }
    records = []
    if args.error_prompts:
        quantized = quantized_copy(pipe, scales, args.granularity)
        errors = step_errors(pipe, quantized, args.error_prompts, args.steps)
        records.append(
            base
            | {
                "what": "step_error",
                "granularity": args.granularity,
                "prompts": args.error_prompts,
                "rel_error_per_step": errors,
                "rel_error_mean": round(sum(errors) / len(errors), 5),
            }
        )
        del quantized
    for spec in [v for v in args.time.split(",") if v]:
        variant, _, presets = spec.partition("@")
        settings = {k: v for preset in presets.split("+") if preset for k, v in INDUCTOR[preset].items()}
        if variant == "fp16":
            module = fp8.denoiser(pipe)
        elif variant.endswith("-linears"):  # the convolutions left in fp16, as before their kernel
            os.environ["DIFFQ_FP8_CONVS"] = "0"
            try:
                module = quantized_copy(pipe, scales, variant.removesuffix("-linears"))
            finally:
                os.environ.pop("DIFFQ_FP8_CONVS")
        else:
            module = quantized_copy(pipe, scales, variant)
        if "persist" in presets.split("+"):
            reductions.widen()
        empty = "empty" in presets.split("+")
        if empty:
            # not into the pipeline's own UNet, which later variants copy
            module = copy.deepcopy(module) if variant == "fp16" else module
            empty_negative.install(module)
        try:
            with torch._inductor.config.patch(settings):
                zero_rows = args.batch if empty else 0
                timing = call_time(module, args.batch, dtype, profile=args.profile, zero_rows=zero_rows)
        finally:
            reductions.restore()
        records.append(base | {"what": "call_time", "variant": spec, "batch": args.batch, **timing})
        print(records[-1], flush=True)
        del module
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    with args.out.open("a") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    sys.exit(main())
