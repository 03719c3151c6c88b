"""The group's answer round (worker/group/comm.py ``Control.gather``) with rank 0 holding the
batch's images, as a CFG pair's rank 0 does after its decode: the host time rank 0 spends in it
per job, on CPU ranks over gloo (the control plane is gloo on GPUs too).

    python3 -m torch.distributed.run --standalone --nproc-per-node 2 bench/answer_gather.py --out g.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.group.comm import Answer, Control


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--images", type=int, default=1, help="images rank 0 holds")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    control = Control(timeout_s=120)
    pixels = np.random.default_rng(0).integers(0, 255, (args.size, args.size, 3), dtype=np.uint8)
    images = [Image.fromarray(pixels)] * args.images if rank == 0 else None
    times = []
    for _ in range(args.rounds + 5):  # the first rounds connect gloo's pairs and are not counted
        dist.barrier()
        started = time.perf_counter()
        control.gather(Answer(rank=rank, images=images))
        times.append(time.perf_counter() - started)
    if rank == 0:
        record = {
            "bench": "answer_gather",
            "label": args.label,
            "ranks": dist.get_world_size(),
            "size": args.size,
            "images": args.images,
            "ms_median": round(statistics.median(times[5:]) * 1e3, 3),
            "ms": [round(t * 1e3, 3) for t in times[5:]],
        }
        print(json.dumps({k: v for k, v in record.items() if k != "ms"}), flush=True)
        with open(args.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as a group's ranks leave (worker/group/cli.py's _finish)


if __name__ == "__main__":
    main()
