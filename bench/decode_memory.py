"""A FLUX group rank's split decode against one GPU's whole decode: peak memory and time, on one GPU.

A FLUX ring or Ulysses group decodes its image split by rows (worker/group/split_decode.py), in
eager bf16 (``compile-vae`` is SDXL's). At 2048² a ring rank peaked at 42.55 GiB against 41.06
with whole decodes (2 H100s, ``fluxring5``): the split GroupNorm computed its statistics over
fp32 copies of the whole activation. Since 2026-11-29 it goes an eighth of the groups at a time.
What a rank's half costs can be measured on one GPU:

- ``whole``: the decoder over the whole latent, as one GPU (and a group before the split) runs it;
- ``twin, 1 rank``: the split twin over a one-rank NCCL group: the same rows as the whole decode,
  so its peak above the whole decode's is what the replaced layers cost; its pixels against the
  whole decode's;
- ``rank 0 of 2, exchanges local``: the twin as rank 0 of a pair whose gathers are local copies
  (each GroupNorm's sums stay this rank's): a rank's rows with its halo rows' convolutions.

Each twin run goes with the GroupNorm as the product runs it (``parts``) and as it ran before
(``whole activation``), alternated. With ``--compiled``, the decoder compiled as ``compile-vae``
compiles SDXL's (FLUX's is not, yet): the whole decode eager and compiled (its pixels against
eager's) and a compiled rank of the pair. Peak: ``max_memory_allocated`` above what was
allocated before the call. Time: the median of ``--repeats`` calls after two warm ones. One
JSON line each.

    python3 bench/decode_memory.py --out $OUT/decode.jsonl
    python3 bench/decode_memory.py --out $OUT/decode.jsonl --compiled
    python3 bench/decode_memory.py --out /tmp/d.jsonl --device cpu --sizes 64 --repeats 1   # a quick check
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pair_parts import timed
from regions import emit


def peak_mib(fn: Callable[[], Any], device: torch.device) -> float | None:
    """MiB allocated at the peak of one ``fn()`` above what was allocated before it (None off CUDA)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return round(peak / 2**20, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--sizes", default="1024,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--compiled", action="store_true", help="the decoder compiled as compile-vae compiles it")
    args = ap.parse_args()
    import torch.distributed as dist
    from diffusers import AutoencoderKL

    from worker.group import split_decode
    from worker.pipelines import models

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:  # NCCL's device_id wants an index
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = torch.bfloat16
    with models.drawn(models.TINY_SEED, dtype, device):
        vae = AutoencoderKL(**models.FLUX_VAE).eval()
    vae.config.force_upcast = False  # vae-fp16: the pipeline's dtype
    common = {"kind": "decode-memory", "vae": "flux", "dtype": "bfloat16", "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}  # fmt: skip
    backend = "nccl" if device.type == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    dist.init_process_group(backend, rank=0, world_size=1, device_id=device if device.type == "cuda" else None)
    sizes = [int(size) for size in args.sizes.split(",")]

    def latent(size: int) -> torch.Tensor:
        generator = torch.Generator(device).manual_seed(size)
        rows = size // 8
        return torch.randn(1, vae.config.latent_channels, rows, rows, device=device, dtype=dtype, generator=generator)

    def measure(size: int, z: torch.Tensor, how: str, decoder: Any, groupnorm: str | None, **extra: Any) -> None:
        with torch.inference_mode():
            first, s = timed(lambda: decoder(z), device, args.repeats)
            peak = peak_mib(lambda: decoder(z), device)  # after a compile's first call
        record = {"size": size, "how": how, "compiled": args.compiled, "groupnorm": groupnorm,
                  "peak_mib": peak, "first_s": round(first, 2), "ms": round(s * 1e3, 2), **extra}  # fmt: skip
        emit(args.out, {**common, **record})

    norm = split_decode._SplitGroupNorm
    groupnorms = {"parts": norm.forward, "whole activation": norm._fused}
    local = lambda x: torch.stack([x, x])  # noqa: E731 - rank 0 of a pair: its gathers stack its own part twice
    try:
        whole_decoder = vae.decoder
        references = {}
        if args.compiled:  # as compile-vae compiles it; the twin then compiles with it (install)
            with torch.inference_mode():
                for size in sizes:
                    z = latent(size)
                    references[size] = whole_decoder(z).float()
                    first, s = timed(lambda z=z: whole_decoder(z), device, args.repeats)
                    emit(args.out, {**common, "size": size, "how": "whole", "compiled": False,
                                    "first_s": round(first, 2), "ms": round(s * 1e3, 2)})  # fmt: skip
            whole_decoder.compile(fullgraph=True, dynamic=False)
        assert split_decode.install(vae, dist.group.WORLD)
        split = vae.decoder.split
        gather = split.gather
        for size in sizes:
            z = latent(size)

            if args.compiled:
                with torch.inference_mode():
                    diff = (whole_decoder(z).float() - references[size]).abs().max().item() * 127.5
                measure(size, z, "whole", whole_decoder, None, max_diff_255_vs_eager=round(diff, 2))
                split.world, split.gather = 2, local
                torch._dynamo.reset()  # the twin's graph with the exchanges local
                measure(size, z, "rank 0 of 2, exchanges local", vae.decoder, "compiled")
                split.world, split.gather = 1, gather
                torch._dynamo.reset()
                continue
            with torch.inference_mode():
                reference = whole_decoder(z).float()
            measure(size, z, "whole", whole_decoder, None)
            for name in ("parts", "whole activation", "parts", "whole activation"):
                norm.forward = groupnorms[name]
                split.world, split.gather = 1, gather
                with torch.inference_mode():
                    diff = (vae.decoder(z).float() - reference).abs().max().item() * 127.5  # [-1, 1] -> 0..255
                measure(size, z, "twin, 1 rank", vae.decoder, name, max_diff_255=round(diff, 2))
                split.world, split.gather = 2, local
                measure(size, z, "rank 0 of 2, exchanges local", vae.decoder, name)
            measure(size, z, "whole", whole_decoder, None)
            del reference
    finally:
        norm.forward = groupnorms["parts"]
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
