"""Do the worker's images match the plain eager fp16 pipeline? Re-renders the first ``--n`` images
an ``e2e_queue.py`` run wrote (same prompts, same seeds, so the same starting latents) with the
plain pipeline, and writes the max and mean pixel difference (0-255) per image, twice: against
diffusers' default decode (the SDXL VAE upcast to fp32) and against an fp16 decode (what
``vae-fp16`` does), so the compile levers and the VAE precision are told apart.

    python3 bench/match_eager.py /tmp/diffq-bench/bench1 --out $OUT/match.jsonl --n 8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.jobspec import GenParams  # noqa: E402
from worker.pipelines.generate import run_batch  # noqa: E402
from worker.pipelines.models import sdxl_random  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("output", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tag", default="")
    ap.add_argument("--dtype", default="float16", help="the eager pipeline's dtype (bfloat16 for a bf16 run)")
    args = ap.parse_args()
    records = [json.loads(line) for line in (args.output / "metadata.jsonl").read_text().splitlines()]
    records = sorted((r for r in records if not r.get("adapter")), key=lambda r: r["seed"])[: args.n]
    first = records[0]
    params = GenParams(
        model="sdxl-random",
        width=first["width"],
        height=first["height"],
        steps=first["steps"],
        guidance=first["guidance"],
    )
    pipe = sdxl_random("cuda", getattr(torch, args.dtype))
    pipe.set_progress_bar_config(disable=True)
    ours = [np.asarray(Image.open(args.output / r["file_name"]).convert("RGB"), dtype=np.float32) for r in records]
    for decode, upcast in (("fp32-upcast (diffusers default)", True), (args.dtype, False)):
        pipe.vae.config.force_upcast = upcast
        result = run_batch(
            pipe, params, [r["prompt"] for r in records], [""] * len(records), [r["seed"] for r in records]
        )
        diffs = [
            np.abs(np.asarray(img, dtype=np.float32) - mine) for img, mine in zip(result.images, ours, strict=True)
        ]
        record = {
            "kind": "match-eager",
            "tag": args.tag,
            "gpu_name": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "dtype": args.dtype,
            "eager_decode": decode,
            "images": len(records),
            "max_abs_diff": float(max(d.max() for d in diffs)),
            "mean_abs_diff": round(float(np.mean([d.mean() for d in diffs])), 4),
            "per_image_max": [float(d.max()) for d in diffs],
            "eager_s_per_img": round((result.denoise_s + result.decode_s + result.encode_s) / len(records), 3),
        }
        with args.out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
