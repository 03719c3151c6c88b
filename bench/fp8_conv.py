"""FP8 implicit-GEMM convolutions (worker/pipelines/fp8_conv.py) against cuDNN's fp16, per
convolution shape of the SDXL UNet at one batch, and summed the way one UNet call runs them.

    python bench/fp8_conv.py --out r.jsonl --rows 16      # 16 UNet rows = a batch of 8 with CFG
    python bench/fp8_conv.py --out r.jsonl --rows 16 --part decoder   # the VAE decoder's, 16 images

``--part decoder`` takes the SDXL VAE decoder's convolutions at 1024² instead (a decode of
``--rows`` images): what an FP8 decoder could save at most in its convolutions.

For each distinct convolution (channels in/out, size, kernel, stride) the UNet runs at 1024²:
cuDNN fp16 channels-last (``cudnn.benchmark`` on, as the worker runs it), the Triton FP8 kernel
(autotuned, its input already FP8), and the cast of the input to FP8 on its own (an upper bound:
in the model the compiler fuses that cast into the normalization before it); the output's
relative error against fp16 with the input at unit scale. The summary line weighs each shape
by how many times one UNet call runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from worker.pipelines import fp8_conv
from worker.pipelines.models import SDXL_UNET, SDXL_VAE

E4M3 = torch.float8_e4m3fn


def counted_convs(model: torch.nn.Module, run: Callable[[], Any]) -> Counter[tuple[int, ...]]:
    """(C, H, W, C_out, k, stride, padding) of every convolution of ``model`` that ``run`` calls, counted."""
    seen: Counter[tuple[int, ...]] = Counter()

    def hook(module: torch.nn.Conv2d, args: tuple[torch.Tensor, ...]) -> None:
        _, c, h, w = args[0].shape
        seen[(c, h, w, module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0])] += 1

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        run()
    for handle in handles:
        handle.remove()
    torch.cuda.empty_cache()
    return seen


def decoder_shapes() -> Counter[tuple[int, ...]]:
    """The convolutions one decode at 1024² runs (:func:`counted_convs`)."""
    from diffusers import AutoencoderKL

    decoder = AutoencoderKL(**SDXL_VAE).to("cuda", torch.float16).eval().decoder
    return counted_convs(decoder, lambda: decoder(torch.randn(1, 4, 128, 128, device="cuda", dtype=torch.float16)))


def conv_shapes(rows: int) -> Counter[tuple[int, ...]]:
    """The convolutions one UNet call runs (:func:`counted_convs`)."""
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(**SDXL_UNET).to("cuda", torch.float16).eval()
    return counted_convs(
        unet,
        lambda: unet(
            torch.randn(1, 4, 128, 128, device="cuda", dtype=torch.float16),
            torch.tensor([500.0], device="cuda"),
            encoder_hidden_states=torch.randn(1, 77, 2048, device="cuda", dtype=torch.float16),
            added_cond_kwargs={
                "text_embeds": torch.randn(1, 1280, device="cuda", dtype=torch.float16),
                "time_ids": torch.randn(1, 6, device="cuda", dtype=torch.float16),
            },
        ),
    )


def timed(fn, repeat: int = 20) -> float:
    """Median milliseconds of ``fn`` over ``repeat`` calls, CUDA events, after two warm calls."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(rows: int, c: int, h: int, w: int, c_out: int, k: int, stride: int, pad: int) -> dict:
    """One shape: errors and median times of cuDNN fp16, the FP8 kernel and the input's cast."""
    x = torch.randn(rows, c, h, w, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c_out, c, k, k, device="cuda", dtype=torch.float16) / (c * k * k) ** 0.5
    bias = torch.randn(c_out, device="cuda", dtype=torch.float16)
    w_cl = weight.contiguous(memory_format=torch.channels_last)
    x_scale = x.abs().amax().float() / 448
    w_scale = weight.abs().amax().float() / 448
    x8 = (x / x_scale).to(E4M3)
    w8 = fp8_conv.weight_matrix((weight / w_scale).to(E4M3))
    scale = (x_scale * w_scale).reshape(1)
    ref = F.conv2d(x, w_cl, bias, stride=stride, padding=pad).float()
    got = fp8_conv.conv2d(x8, w8, scale, bias, (k, k), stride, pad, torch.float16).float()
    same_inputs = fp8_conv.reference(x8, w8, scale, bias, (k, k), stride, pad, torch.float32)
    flops = 2 * rows * ref.shape[2] * ref.shape[3] * c_out * c * k * k
    inv = 1 / x_scale
    row = {
        # against fp16: FP8's own error; against fp32 on the same FP8 values: the kernel's
        "rel_err": round(float((got - ref).norm() / ref.norm()), 5),
        "kernel_rel_err": round(float((got - same_inputs).norm() / same_inputs.norm()), 6),
        "fp16_ms": round(timed(lambda: F.conv2d(x, w_cl, bias, stride=stride, padding=pad)), 4),
        "fp8_ms": round(timed(lambda: fp8_conv.conv2d(x8, w8, scale, bias, (k, k), stride, pad, torch.float16)), 4),
        "fp8_nchw_out_ms": round(
            timed(lambda: fp8_conv.conv2d(x8, w8, scale, bias, (k, k), stride, pad, torch.float16, False)), 4
        ),
        "cast_ms": round(timed(lambda: (x * inv).clamp(-448, 448).to(E4M3)), 4),
        "config": str(fp8_conv._kernel().best_config),
    }
    row["fp16_tflops"] = round(flops / row["fp16_ms"] / 1e9, 1)
    row["fp8_tflops"] = round(flops / row["fp8_ms"] / 1e9, 1)
    return row


def record(out: Path, row: dict) -> None:
    """Print ``row`` and append it to the JSON lines file ``out``."""
    print(json.dumps(row), flush=True)
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def summary(label: str, rows: int, total: dict[str, float]) -> dict:
    """One UNet call's kernels summed (``fp16_ms``, ``fp8_ms``, ``cast_ms`` and any other), with
    the FP8 kernels' speed-up alone and with their input casts unfused."""
    line = {"label": label, "rows": rows, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            **{k: round(v, 3) for k, v in total.items()}}  # fmt: skip
    line["speedup_kernels"] = round(total["fp16_ms"] / total["fp8_ms"], 3)
    line["speedup_with_cast"] = round(total["fp16_ms"] / (total["fp8_ms"] + total["cast_ms"]), 3)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON lines file to append to")
    parser.add_argument("--rows", type=int, default=16, help="UNet rows (batch x 2 with CFG), or images decoded")
    parser.add_argument("--part", choices=("unet", "decoder"), default="unet", help="whose convolutions")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    shapes = conv_shapes(args.rows) if args.part == "unet" else decoder_shapes()
    out = Path(args.out)
    total = Counter()
    for (c, h, w, c_out, k, stride, pad), count in sorted(shapes.items()):
        row: dict = {"label": "fp8conv.shape", "part": args.part, "rows": args.rows, "c": c, "hw": h, "c_out": c_out,
                     "k": k, "stride": stride, "count": count}  # fmt: skip
        if c < 16 or c_out < 16:
            row["skipped"] = "fewer than 16 channels (conv_in / conv_out stay fp16)"
            print(json.dumps(row), flush=True)
            continue
        row.update(measure(args.rows, c, h, w, c_out, k, stride, pad))
        for key in ("fp16_ms", "fp8_ms", "cast_ms"):
            total[key] += row[key] * count
        record(out, row)
    record(out, summary(f"fp8conv.{args.part}_call", args.rows, total))


if __name__ == "__main__":
    sys.exit(main())
