"""``cuda-graphs`` on a GPU: the same images as without it, through adapter switches.

Two warm pipelines of the same model on one GPU, one with the lever and one without (they share
the precompiled files: the lever is not part of their key), run the same one-image jobs through
a sequence of adapters (none, a LoRA, a DoRA, none, the LoRA at half scale). Each job's image is
compared between the two, and the time of each job taken. The CPU tests replace the CUDA graph
with a stand-in (tests/test_step_graphs.py); this is the real one, with real merges between the
replays. One JSON line per job to ``--out``; adapters from ``bench/make_adapters.py``.

    python3 bench/make_adapters.py /tmp/adapters
    python3 bench/graphs_check.py --adapters /tmp/adapters --out $OUT/graphs-check.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapters", type=Path, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="sdxl-random")
    ap.add_argument("--speedups", default="vae-fp16,compile-unet,compile-vae")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--against", help="the second pipeline's levers (default: --speedups and cuda-graphs)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    import numpy as np
    import torch

    from common.jobspec import GenParams
    from worker.pipelines import step_graphs
    from worker.pipelines.backend import Batch
    from worker.pipelines.warm import WarmPipelines

    cache = os.environ.get("DIFFQ_CACHE", "/tmp/dq-cache")
    plain = WarmPipelines(cache, device="cuda", speedups=args.speedups, precision=args.precision)
    against = args.against or f"{args.speedups},cuda-graphs"
    graphed = WarmPipelines(cache, device="cuda", speedups=against, precision=args.precision)
    lora, dora = str(args.adapters / "lora"), str(args.adapters / "dora")
    sequence = [(None, 1.0), (lora, 1.0), (dora, 1.0), (None, 1.0), (lora, 0.5), (lora, 0.5)]
    n = args.batch
    previous = None
    for index, (adapter, scale) in enumerate(sequence):
        params = GenParams(model=args.model, width=1024, height=1024, steps=args.steps, guidance=5.0,
                           adapter=adapter, adapter_scale=scale)  # fmt: skip
        batch = Batch(params, [f"graphs check {i}, a red fox" for i in range(n)], [""] * n, list(range(n)), n)
        images, seconds = [], []
        for pipelines in (plain, graphed):
            loaded, _ = pipelines.get(args.model)
            torch.cuda.synchronize()
            started = time.perf_counter()
            pipelines.use_adapter(loaded, adapter, scale)
            result, _ = pipelines.generate(loaded, batch)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - started)
            images.append(np.stack([np.asarray(image, dtype=np.int16) for image in result.images]))
        graphs = step_graphs.installed(graphed.get(args.model)[0].pipe)
        record = {
            "kind": "graphs-check",
            "job": index,
            "adapter": Path(adapter).name if adapter else None,
            "scale": scale,
            "batch": n,
            "speedups": args.speedups,
            "against": against,
            "precision": args.precision,
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "max_pixel_diff_255": int(np.abs(images[0] - images[1]).max()),
            "mean_pixel_diff_255": round(float(np.abs(images[0] - images[1]).mean()), 4),
            "image_mean": round(float(images[1].mean()), 2),
            # what the switch changed in the image (without the lever): the size of error a
            # graph replaying the previous weights would show
            "max_diff_from_previous_job_255": None if previous is None else int(np.abs(images[0] - previous).max()),
            "s_without": round(seconds[0], 3),
            "s_with": round(seconds[1], 3),
            "captures": graphs.captures if graphs else None,
            "replays": graphs.replays if graphs else None,
        }
        previous = images[0]
        print(json.dumps(record), flush=True)
        with open(args.out, "a") as fh:
            fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
