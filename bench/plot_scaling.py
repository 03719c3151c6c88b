"""Draw docs/scaling.png from bench/results/*-queue.jsonl with Pillow (no plotting dependency).

python3 bench/plot_scaling.py bench/results/h200x4-queue.jsonl docs/scaling.png
"""

from __future__ import annotations

import json
import sys

from PIL import Image, ImageDraw


def main(src: str, dst: str) -> None:
    with open(src) as handle:
        runs = [json.loads(line) for line in handle if line.strip()]
    runs = [r for r in runs if r.get("kind") == "queue"]
    base = next(r["steady_img_per_s"] for r in runs if r["gpus"] == 1)
    width, height, pad = 640, 420, 60
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    max_gpus = max(r["gpus"] for r in runs)
    top = max(max_gpus, max(r["steady_img_per_s"] / base for r in runs)) * 1.1

    def xy(gpus: float, speedup: float) -> tuple[float, float]:
        return (pad + (gpus / max_gpus) * (width - 2 * pad), height - pad - speedup / top * (height - 2 * pad))

    draw.line([xy(0, 0), xy(max_gpus, 0)], fill="black")
    draw.line([xy(0, 0), xy(0, top)], fill="black")
    draw.line([xy(0, 0), xy(max_gpus, max_gpus)], fill=(170, 170, 170))
    draw.line([xy(0, 0), xy(max_gpus, 0.95 * max_gpus)], fill=(220, 180, 180))
    points = sorted((r["gpus"], r["steady_img_per_s"] / base, r["steady_img_per_s"]) for r in runs)
    draw.line([xy(g, s) for g, s, _ in points], fill=(30, 90, 200), width=3)
    for g, s, rate in points:
        x, y = xy(g, s)
        draw.ellipse([x - 5, y - 5, x + 5, y + 5], fill=(30, 90, 200))
        label = f"{s:.2f}x ({rate:.2f} img/s)"
        draw.text((x - 150 if g == max_gpus else x + 8, y - 14), label, fill="black")
        draw.text((x - 4, height - pad + 6), str(g), fill="black")
    draw.text((pad, 15), "diffq: pinned workers per GPU, SDXL arch 1024^2, 30 steps, H200", fill="black")
    draw.text((pad, 30), "speed-up vs 1 GPU (steady state); grey: linear, pink: 0.95 x N", fill=(90, 90, 90))
    draw.text((width // 2 - 20, height - 25), "GPUs", fill="black")
    img.save(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
