"""A prompt's encode with the text encoders' calls replayed as CUDA graphs (``encoder-graphs``).

Every image pays its prompt's encode before its first step, and every rank of a group pays it
whole: through the queue an SDXL CFG pair's one-image job spent 0.031 s of 0.713 s in it (2
H100s), and it ran 16.2 ms on its own on an H200, where the arithmetic of 77 tokens through both
CLIPs is a fraction of a millisecond: the host launching the kernels of 44 layers sets its time.
This script times ``encode_prompt`` as the worker calls it (worker/pipelines/generate.py), eager
and with the product's graphs (worker/pipelines/step_graphs.py), alternated: SDXL (both CLIPs,
fp16) with an empty negative and with a negative prompt, FLUX (CLIP-L and T5-XXL, bf16; its
transformer cut to one block of each kind, which the encode does not touch). Each figure is the
median host wall time of ``--repeats`` calls, synced; the outputs of both ways are compared.

    python3 bench/encode_graphs.py --out $OUT/encode.jsonl
    python3 bench/encode_graphs.py --out /tmp/e.jsonl --device cpu --models tiny --repeats 2   # a quick check
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pair_parts import seconds
from regions import emit


def pipeline(model: str, device: torch.device) -> Any:
    from worker.pipelines import models

    if model == "sdxl-random":
        return models.sdxl_random(device, torch.float16, drawn_in_dtype=True)
    if model == "flux-random":
        one_block = {**models.FLUX_TRANSFORMER, "num_layers": 1, "num_single_layers": 1}
        return models.build_flux(one_block, models.FLUX_VAE, models.FLUX_CLIP, models.FLUX_T5,
                                 t5_vocab=models.FLUX_T5_VOCAB, clip_vocab=models.SDXL_VOCAB,
                                 device=device, dtype=torch.bfloat16)  # fmt: skip
    parts = (models.TINY_UNET, models.TINY_VAE, models.TINY_TEXT, models.TINY_TEXT)
    return models.build_sdxl(*parts, vocab_size=None, device=device, dtype=torch.float32)


def encoder(pipe: Any, batch: int, negative: bool) -> Callable[[], tuple[torch.Tensor, ...]]:
    """``encode_prompt`` as :func:`worker.pipelines.generate.run_batch` calls it."""
    device = pipe._execution_device
    prompts = [f"a photo of a red fox in the snow, number {i}" for i in range(batch)]
    if getattr(pipe, "transformer", None) is not None:
        return lambda: pipe.encode_prompt(prompt=prompts, prompt_2=None, device=device, num_images_per_prompt=1,
                                          max_sequence_length=512)[:2]  # fmt: skip
    negatives = [f"blurry, low quality {i}" for i in range(batch)] if negative else None
    return lambda: pipe.encode_prompt(prompt=prompts, device=device, num_images_per_prompt=1,
                                      do_classifier_free_guidance=True, negative_prompt=negatives)  # fmt: skip


def main() -> None:
    from worker.pipelines import step_graphs

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="sdxl-random,flux-random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for model in args.models.split(","):
        pipe = pipeline(model, device)
        flux = getattr(pipe, "transformer", None) is not None
        graphs = step_graphs.install_encoders(pipe)  # none on the CPU (the quick check times eager twice)
        cases = [(1, False), (4, False)] if flux else [(1, False), (1, True), (8, False)]
        for batch, negative in cases:
            encode = encoder(pipe, batch, negative)
            with torch.inference_mode():
                for g in graphs:
                    g.paused = True
                eager_out = encode()
                seconds(encode, device)
                for g in graphs:
                    g.paused = False
                first = seconds(encode, device)  # the capture: two warm calls and a recording per encoder
                graphed_out = encode()
                times: dict[str, list[float]] = {"eager": [], "graphed": []}
                for _ in range(args.repeats):
                    for how in ("eager", "graphed"):
                        for g in graphs:
                            g.paused = how == "eager"
                        times[how].append(seconds(encode, device))
            diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(eager_out, graphed_out, strict=True)
                       if isinstance(a, torch.Tensor))  # fmt: skip
            emit(args.out, {
                "kind": "encode-graphs", "model": model, "gpu": gpu, "torch": torch.__version__, "batch": batch,
                "negative": negative, "eager_ms": round(statistics.median(times["eager"]) * 1e3, 3),
                "graphed_ms": round(statistics.median(times["graphed"]) * 1e3, 3),
                "capture_s": round(first, 3), "graphs": sum(len(g.graphs) for g in graphs),
                "max_abs_diff": diff,
            })  # fmt: skip
        del pipe, graphs
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
