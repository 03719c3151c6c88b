"""The serial parts of an SDXL CFG pair's one-image job, on one GPU: the decode and the prompt's encode.

At batch 1 a CFG pair splits the UNet's two rows; the rest of the job ran whole: through the
queue on 2 H100s a job took 0.713 s, of it 0.031 s encoding the prompt and 0.052 s decoding (one
rank decoded while the other waited). Since 2026-11-29 the pair decodes its one image split by
rows (worker/group/split_decode.py). What a rank's half costs can be measured on one GPU; what
the exchanges cost needs two. Three parts:

- ``decode``: the SDXL VAE decoder (fp16, ``vae-fp16``), eager and compiled as ``compile-vae``
  compiles it, at the whole latent's rows (one GPU's decode) and at half of them (a rank's
  compute, no exchange); then the product's split twin, compiled with its collectives inside,
  over a one-rank NCCL group (its graph runs on a GPU), its pixels against the whole decode's;
  then the twin as rank 0 of a pair whose exchanges are local copies (a rank's compute with its
  halo rows' convolutions; the exchanges' latency over NVLink needs two GPUs).
- ``encode``: ``encode_prompt`` of one prompt with an empty negative (SDXL's zeros), as the
  worker calls it, eager and with both text encoders compiled (host wall time: at one prompt the
  host launches the kernels of 44 layers).
Each figure is the median of ``--repeats`` calls after warm-up; one JSON line each.

    python3 bench/pair_parts.py --out $OUT/parts.jsonl
    python3 bench/pair_parts.py --out /tmp/p.jsonl --device cpu --model tiny --size 64 --repeats 2   # a quick check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from regions import emit


def seconds(fn: Callable[[], Any], device: torch.device) -> float:
    """One call's host wall time, the device synced before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, float]:
    """(first call's seconds, median seconds of ``repeats`` calls after two warm ones), host wall time."""
    first = seconds(fn, device)
    seconds(fn, device)
    return first, statistics.median(seconds(fn, device) for _ in range(repeats))


def pipeline(model: str, device: torch.device, dtype: torch.dtype) -> Any:
    from worker.pipelines import models

    if model == "sdxl-random":
        pipe = models.sdxl_random(device, dtype, drawn_in_dtype=True)
    else:
        parts = (models.TINY_UNET, models.TINY_VAE, models.TINY_TEXT, models.TINY_TEXT)
        pipe = models.build_sdxl(*parts, vocab_size=None, device=device, dtype=dtype)
    pipe.vae.config.force_upcast = False  # vae-fp16
    return pipe


def decode_part(pipe: Any, args: argparse.Namespace, device: torch.device, common: dict[str, Any]) -> None:
    import torch.distributed as dist

    from worker.group import split_decode

    vae = pipe.vae
    rows = args.size // 8
    z = torch.randn(1, vae.config.latent_channels, rows, rows, device=device, dtype=vae.dtype)
    half = z[:, :, : rows // 2].contiguous()

    def decode(latent: torch.Tensor) -> torch.Tensor:
        return vae.decode(latent, return_dict=False)[0]

    with torch.inference_mode():
        whole = decode(z)
        for how in ("eager", "compiled"):
            if how == "compiled":
                vae.decoder.compile(fullgraph=True, dynamic=False)  # as compile-vae does (lazily)
            for part, latent in (("whole", z), ("half", half)):
                first, s = timed(lambda latent=latent: decode(latent), device, args.repeats)
                record = {
                    "part": "decode",
                    "how": how,
                    "rows": part,
                    "first_s": round(first, 2),
                    "ms": round(s * 1e3, 3),
                }
                if part == "whole":  # what the compile alone changes: the yardstick for the split's pixels
                    record["max_diff_255"] = round((decode(z).float() - whole.float()).abs().max().item() * 127.5, 2)
                emit(args.out, {**common, **record})
        compiled_whole = decode(z)
        backend = "nccl" if device.type == "cuda" else "gloo"
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group(backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None)
        try:
            assert split_decode.install(vae, dist.group.WORLD)
            exchanges = sum(
                type(m).__name__ in ("_HaloConv", "_GatherTokens") or 2 * (type(m).__name__ == "_SplitGroupNorm")
                for m in vae.decoder.twin.modules()
            )
            first, s = timed(lambda: decode(z), device, args.repeats)
            split = decode(z).float()
            diff = (split - whole.float()).abs().max().item() * 127.5  # [-1, 1] -> 0..255, against eager
            diff_compiled = (split - compiled_whole.float()).abs().max().item() * 127.5
            record = {"part": "decode", "how": "split twin, compiled, 1 rank", "rows": "whole",
                      "first_s": round(first, 2), "ms": round(s * 1e3, 3), "exchanges": exchanges + 1,
                      "max_diff_255": round(diff, 2), "max_diff_255_vs_compiled": round(diff_compiled, 2)}  # fmt: skip
            emit(args.out, {**common, **record})
            # rank 0 of a pair, its exchanges local copies (gathers stack its own rows twice; the GroupNorm sums
            # stay this one rank's): a rank's compute at half the rows, the halo rows' convolutions included
            split = vae.decoder.split
            split.world, split.gather = 2, lambda x: torch.stack([x, x])
            torch._dynamo.reset()  # the twin's graph again, with the exchanges local
            first, s = timed(lambda: decode(z), device, args.repeats)
            record = {"part": "decode", "how": "split twin, compiled, rank 0 of 2, exchanges local", "rows": "half",
                      "first_s": round(first, 2), "ms": round(s * 1e3, 3)}  # fmt: skip
            emit(args.out, {**common, **record})
        finally:
            dist.destroy_process_group()


def encode_part(pipe: Any, args: argparse.Namespace, device: torch.device, common: dict[str, Any]) -> None:
    def encode() -> tuple[torch.Tensor, ...]:
        prompt = ["a red fox in snow, benchmark prompt 0"]
        return pipe.encode_prompt(prompt=prompt, device=device, do_classifier_free_guidance=True, negative_prompt=None)

    with torch.inference_mode():
        eager = encode()
        first, s = timed(encode, device, args.repeats)
        emit(
            args.out, {**common, "part": "encode", "how": "eager", "first_s": round(first, 2), "ms": round(s * 1e3, 3)}
        )
        pipe.text_encoder.compile(fullgraph=True, dynamic=False)
        pipe.text_encoder_2.compile(fullgraph=True, dynamic=False)
        first, s = timed(encode, device, args.repeats)
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(eager, encode(), strict=True))
        emit(args.out, {**common, "part": "encode", "how": "compiled", "first_s": round(first, 2),
                        "ms": round(s * 1e3, 3), "max_abs_diff": round(diff, 5)})  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="sdxl-random", choices=["sdxl-random", "tiny"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--parts", default="decode,encode")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # NCCL's device_id wants an index
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    pipe = pipeline(args.model, device, dtype)
    common = {"kind": "pair-parts", "model": args.model, "size": args.size, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}  # fmt: skip
    for part in args.parts.split(","):
        {"decode": decode_part, "encode": encode_part}[part](pipe, args, device, common)


if __name__ == "__main__":
    main()
