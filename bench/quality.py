"""What a precision costs in quality: one run's images against another's (fp8 against fp16),
the same prompts and seeds, paired by file name (diffq names an image by its parameters, prompt
and seed, never by the precision it was made in).

Run it before a campaign, on your own model and prompts: two small runs to two folders
(``worker run --precision fp16`` and ``--precision fp8``, the same ``producer enqueue`` each),
then

    python bench/quality.py runs/fp16 runs/fp8 --clip openai/clip-vit-large-patch14 --out quality.jsonl

It prints and appends one JSON line: per-image PSNR and SSIM against the reference run (how
far each image moved), and with ``--clip`` the CLIP score of each run against its prompts (does
the image still show the prompt; MLPerf's SDXL gate is CLIP 31.69-31.81 with FID 23.01-23.95
on COCO) and the Fréchet distance between the two runs' CLIP image features (do the images
still look like the same distribution). That distance is on CLIP features, not the Inception
features of the FID MLPerf reports: the two are not on one scale, compare it only between
precisions of one model. No figure here was measured on real weights: this machine and the GPU
lease cannot download any (docs/benchmarks.md says what was run on random weights).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def pairs(reference: Path, candidate: Path) -> list[tuple[Path, Path]]:
    """Images present in both runs, by their path under each run's ``images/`` folder."""
    ours = {p.relative_to(reference): p for p in reference.rglob("*.png")}
    theirs = {p.relative_to(candidate): p for p in candidate.rglob("*.png")}
    return [(ours[name], theirs[name]) for name in sorted(ours.keys() & theirs.keys())]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM (Wang et al. 2004: 11x11 Gaussian window, sigma 1.5) over the RGB channels."""
    x = torch.from_numpy(a).permute(2, 0, 1)[None].float()
    y = torch.from_numpy(b).permute(2, 0, 1)[None].float()
    coords = torch.arange(11, dtype=torch.float32) - 5
    g = torch.exp(-(coords**2) / (2 * 1.5**2))
    g = g / g.sum()
    window = (g[:, None] * g[None, :]).expand(3, 1, 11, 11)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(t, window, groups=3)

    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cov = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    value = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(value.mean())


def prompt_of(image: Path) -> str | None:
    """The prompt diffq wrote into the PNG's text chunk (images carry their parameters)."""
    with Image.open(image) as opened:
        return opened.text.get("prompt")  # type: ignore[attr-defined]


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to two sets of feature rows (as FID does)."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    # sqrt of cov_a @ cov_b through the symmetric form sqrt(A) B sqrt(A): real eigenvalues
    vals, vecs = np.linalg.eigh(cov_a)
    root_a = (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T
    middle = np.linalg.eigvalsh(root_a @ cov_b @ root_a)
    trace_root = float(np.sqrt(np.clip(middle, 0, None)).sum())
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * trace_root)


def clip_measures(matched: list[tuple[Path, Path]], model_name: str, device: str) -> dict[str, float]:
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(model_name).to(device).eval()
    processor = CLIPProcessor.from_pretrained(model_name)
    features: dict[str, list[np.ndarray]] = {"reference": [], "candidate": []}
    scores: dict[str, list[float]] = {"reference": [], "candidate": []}
    for ref, cand in matched:
        prompt = prompt_of(ref) or ""
        for side, path in (("reference", ref), ("candidate", cand)):
            with Image.open(path) as image:
                inputs = processor(text=[prompt], images=image.convert("RGB"), return_tensors="pt", padding=True)
            inputs = {k: v.to(device) for k, v in inputs.items()}
            with torch.no_grad():
                out = model(**inputs)
            img = torch.nn.functional.normalize(out.image_embeds, dim=-1)
            txt = torch.nn.functional.normalize(out.text_embeds, dim=-1)
            scores[side].append(100 * max(float((img * txt).sum()), 0.0))  # CLIP score as MLPerf takes it
            features[side].append(img[0].float().cpu().numpy())
    return {
        "clip_score_reference": round(float(np.mean(scores["reference"])), 3),
        "clip_score_candidate": round(float(np.mean(scores["candidate"])), 3),
        "fd_clip_features": round(frechet(np.stack(features["reference"]), np.stack(features["candidate"])), 5),
    }


def measure(reference: Path, candidate: Path, clip: str | None = None, device: str = "cpu") -> dict[str, object]:
    matched = pairs(reference, candidate)
    if not matched:
        raise SystemExit(f"no image of {reference} has a namesake under {candidate}: were they the same prompts?")
    psnrs, ssims, worst = [], [], []
    for ref, cand in matched:
        a = np.array(Image.open(ref).convert("RGB"))
        b = np.array(Image.open(cand).convert("RGB"))
        psnrs.append(psnr(a, b))
        ssims.append(ssim(a, b))
        worst.append(int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()))
    finite = [p for p in psnrs if math.isfinite(p)]
    record: dict[str, object] = {
        "kind": "quality",
        "reference": str(reference),
        "candidate": str(candidate),
        "images": len(matched),
        "psnr_mean_db": round(float(np.mean(finite)), 3) if finite else math.inf,
        "psnr_min_db": round(float(np.min(finite)), 3) if finite else math.inf,
        "ssim_mean": round(float(np.mean(ssims)), 5),
        "ssim_min": round(float(np.min(ssims)), 5),
        "max_abs_diff": max(worst),
        "identical_images": len(psnrs) - len(finite),
    }
    if clip:
        record |= {"clip_model": clip, **clip_measures(matched, clip, device)}
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference", type=Path, help="the run to compare against (fp16)")
    ap.add_argument("candidate", type=Path, help="the run under test (fp8)")
    ap.add_argument("--clip", help="a CLIP model (hub name or folder) for CLIP score and feature distance")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, help="append the JSON line here too")
    args = ap.parse_args()
    started = time.perf_counter()
    record = {"tag": args.tag, **measure(args.reference, args.candidate, args.clip, args.device)}
    record["seconds"] = round(time.perf_counter() - started, 2)
    line = json.dumps(record)
    print(line)
    if args.out:
        with args.out.open("a") as out:
            out.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
