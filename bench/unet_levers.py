"""The compile levers of the throughput issue, one at a time, on SDXL's whole UNet at the
batch the worker runs (8 images, 16 with CFG, 1024²): what each costs to build and what a call
takes once built, with the GPU's power and SM clock while it runs (the fp16 UNet sits at the
H100's 700 W limit, so a lever that saves work may still not save time).

Variants, in the order given by ``--variants``:
  eager-fp16, eager-bf16         no compile
  compile-fp16, compile-bf16     the worker's compile-unet (fullgraph, static shapes)
  cudagraphs-fp16                the same graph replayed as a CUDA graph (mode="reduce-overhead")
  autotune-fp16                  Inductor's GEMM/conv autotuning (mode="max-autotune-no-cudagraphs")
  gemmtune-fp16                  cudagraphs-fp16 with Inductor's GEMM autotuning only (Triton templates
                                 against cuBLAS per shape; convolutions stay cuDNN): can one row, whose
                                 GEMMs of M = 1,024 leave SMs idle, gain what two rows do not?
  fusedgraphs-fp16               cudagraphs-fp16 with each attention's q, k and v one product (the
                                 fuse-qkv lever): three times the output tiles of one of them, for a
                                 row whose GEMMs do not fill the GPU

Each variant compiles a fresh copy of the eager weights; a variant is skipped when less than
``--min-left-s`` of the budget is left. Output differences are against eager fp16.

    python3 bench/unet_levers.py --out $OUT/levers.jsonl --budget-s 480
    python3 bench/unet_levers.py --out /tmp/l.jsonl --model tiny --device cpu --size 256 \
        --variants eager-fp16,compile-fp16
    python3 bench/unet_levers.py --out $OUT/rows.jsonl --rows 1 --variants eager-fp16,cudagraphs-fp16   # a CFG rank
    python3 bench/unet_levers.py --out $OUT/b.jsonl --rows 1 --part down2 --variants cudagraphs-fp16,gemmtune-fp16

``--part down2`` times one of the UNet's transformers at its 32×32 level instead of the whole
UNet (10 of the 60 blocks that run there): a module small enough to tune inside one call.
"""

from __future__ import annotations

import argparse
import copy
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch._inductor.config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from regions import STARTED, emit, output_diff, timed_calls, unet_inputs

MODES = {
    "compile": "default",
    "cudagraphs": "reduce-overhead",
    "autotune": "max-autotune-no-cudagraphs",
    "gemmtune": "reduce-overhead",
    "fusedgraphs": "reduce-overhead",
}
# Inductor settings a variant compiles under (its first two calls: the compile and any autotuning).
SETTINGS: dict[str, dict[str, Any]] = {
    "gemmtune": {"max_autotune_gemm": True, "max_autotune_conv_backends": "ATEN"},
}


class PowerSampler:
    """``nvidia-smi`` sampling power and SM clock every 100 ms while a variant's steady calls run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> PowerSampler:
        if shutil.which("nvidia-smi"):
            query = ["--query-gpu=power.draw,clocks.sm", "--format=csv,noheader,nounits", "-lms", "100"]
            self.proc = subprocess.Popen(["nvidia-smi", *query], stdout=self.path.open("w"), stderr=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()

    def summary(self) -> dict[str, float]:
        rows = []
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            try:
                watts, mhz = (float(x) for x in line.split(","))
            except ValueError:
                continue
            rows.append((watts, mhz))
        rows = rows[len(rows) // 5 :]  # the first fifth is the ramp from idle
        if not rows:
            return {}
        return {
            "watts_median": round(statistics.median(w for w, _ in rows), 1),
            "sm_mhz_median": round(statistics.median(m for _, m in rows), 0),
            "samples": len(rows),
        }


def part_inputs(part: torch.nn.Module, rows: int, side: int, device: torch.device) -> dict[str, Any]:
    """One UNet transformer's inputs: a ``side`` x ``side`` feature map and the prompt's embeddings."""
    g = torch.Generator(device="cpu").manual_seed(0)
    dtype = next(part.parameters()).dtype
    channels = part.config.in_channels
    cross = part.config.cross_attention_dim
    return {
        "hidden_states": torch.randn(rows, channels, side, side, generator=g).to(device, dtype),
        "encoder_hidden_states": torch.randn(rows, 77, cross, generator=g).to(device, dtype),
        "return_dict": False,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="sdxl-random", choices=["sdxl-random", "tiny"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=8, help="images; the UNet sees twice as many (CFG)")
    ap.add_argument("--rows", type=int, default=0, help="UNet rows if not 2 x batch (1: a CFG rank)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--part", choices=["unet", "down2"], default="unet", help="down2: one 32x32-level transformer")
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--min-left-s", type=float, default=150)
    variants = "eager-fp16,eager-bf16,compile-fp16,cudagraphs-fp16,compile-bf16,autotune-fp16"
    ap.add_argument("--variants", default=variants)
    args = ap.parse_args()
    import diffusers

    from common.settings import point_compile_cache_at
    from worker.pipelines import models

    point_compile_cache_at("/tmp/diffq-levers-cache")
    device = torch.device(args.device)
    env = {
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "model": args.model,
        "batch": args.batch,
        "unet_batch": args.rows or 2 * args.batch,
        "size": args.size,
        "part": args.part,
    }
    emit(args.out, {"kind": "env", **env})
    if args.model == "tiny":
        from diffusers import StableDiffusionXLPipeline

        pipe = StableDiffusionXLPipeline.from_pretrained(models.ensure_tiny("/tmp/diffq-levers-cache"))
    else:
        # drawn on the GPU where there is one (seconds, not the CPU's minute; other random weights)
        pipe = models.sdxl_random(device, torch.float16, drawn_in_dtype=device.type == "cuda")
    pristine = pipe.unet.eval().requires_grad_(False)
    side = args.size // 8
    if args.part == "down2":  # the deepest down block's first transformer (SDXL: down_blocks[2], 32x32 at 1024²)
        level = max(i for i, block in enumerate(pristine.down_blocks) if hasattr(block, "attentions"))
        pristine, side = pristine.down_blocks[level].attentions[0], side // 2**level
    del pipe
    reference: torch.Tensor | None = None
    for variant in args.variants.split(","):
        left = args.budget_s - (time.perf_counter() - STARTED)
        if variant != "eager-fp16" and left < args.min_left_s:
            emit(args.out, {"kind": "skipped", "config": variant, "left_s": round(left, 1)})
            continue
        kind, dtype_name = variant.rsplit("-", 1)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        torch._dynamo.reset()
        unet = copy.deepcopy(pristine).to(device, dtype)
        if kind == "fusedgraphs":  # as the fuse-qkv lever does (UNet2DConditionModel.fuse_qkv_projections), any part
            from diffusers.models.attention_processor import Attention, FusedAttnProcessor2_0

            for module in unet.modules():
                if isinstance(module, Attention):
                    module.fuse_projections(fuse=True)
                    module.set_processor(FusedAttnProcessor2_0())
        if kind != "eager":
            unet = torch.compile(unet, fullgraph=True, dynamic=False, mode=MODES[kind])
        rows = args.rows or 2 * args.batch
        if args.part == "down2":
            inputs = part_inputs(unet, rows, side, device)
        else:
            inputs = unet_inputs(unet, rows, args.size, device)

        def call(unet: Any = unet, inputs: dict = inputs) -> torch.Tensor:
            with torch.inference_mode():
                return unet(**inputs)[0].clone()

        with torch._inductor.config.patch(SETTINGS.get(kind, {})):
            first_ms, _, _ = timed_calls(call, 0, device)
        with PowerSampler(args.out.with_suffix(f".{variant}.power")) as power:
            _, times, out = timed_calls(call, args.repeats, device)
        if reference is None:
            reference = out
        emit(
            args.out,
            {
                "kind": "unet",
                "config": variant,
                **env,
                "dtype": dtype_name,
                "first_call_ms": round(first_ms, 1),
                "step_ms": round(statistics.median(times), 2),
                "step_ms_all": [round(t, 1) for t in times],
                **power.summary(),
                **output_diff(out, reference),
            },
        )
        del unet, inputs, out
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
