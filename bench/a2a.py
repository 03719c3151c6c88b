"""How fast NCCL's all-to-all runs at a FLUX Ulysses exchange's size (``torchrun`` on the GPUs).

The FLUX 1024² Ulysses 2 profile (docs/benchmarks.md) put 0.555 s per image in all-to-all kernels
on the rank that arrived last: 6,384 exchanges of 7 MB each way, about 81 GB/s, where NVLink 4
carries 450 GB/s each way. This times that one exchange alone, under whatever ``NCCL_*``
environment the caller sets, so the NCCL settings can be compared without a model.

    NCCL_MIN_P2P_NCHANNELS=32 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \\
        bench/a2a.py --label p2p32 --out a2a.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4608, help="image + text tokens of the whole sequence")
    ap.add_argument("--hidden", type=int, default=3072)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    # one rank's q (or k, v, output): its share of the tokens, every head
    x = torch.randn(args.tokens // world, args.hidden, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    for _ in range(20):
        dist.all_to_all_single(y, x)
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(args.iters):
        dist.all_to_all_single(y, x)
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) * 1000 / args.iters
    sent = x.numel() * x.element_size() * (world - 1) // world  # bytes that leave this rank per exchange
    line = {
        "kind": "a2a",
        "label": args.label,
        "rank": rank,
        "gpus": world,
        "bytes_sent": sent,
        "us_per_exchange": round(us, 1),
        "gb_per_s": round(sent / us / 1000, 1),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    with args.out.open("a") as f:  # one line per rank; lines are short, appends do not interleave
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
