"""A ring rank's attention kernels against one attention over all the keys, on one GPU.

On 2 H200s a FLUX ring rank spent 0.45 s an image in attention where one GPU spends 0.74 s
(``fluxwhere``): 0.08 s over half. The product (:func:`worker.group.ring_attention.ring_attention`)
makes two cuDNN calls of half the keys each and merges them (:mod:`worker.group.attention_merge`).
One call over every rank's keys needs them side by side: ``bench/ring_whole.py`` copied them
there (57 MB a layer) and lost 0.04 s an image. In tokens-first memory the gather's buffer
already holds each rank's tokens one after the other, so the keys of all ranks are one
``[batch, tokens, heads, dim]`` tensor that cuDNN can read through a heads-first view, with no
copy. Whether that is worth building depends on what the calls alone cost, which one GPU can
measure: this script times one layer's attention at a ring rank's shape (every FLUX layer
attends the same tokens, text and image together) as the product runs it, as one call of all the
keys heads-first, and as one call through tokens-first views; and one GPU's whole attention,
cuDNN's and flash's. Each way is captured as one CUDA graph of ``--layers`` calls (one step's
57), replayed, timed with CUDA events, in ms per layer; outputs are compared with one GPU's.

    python3 bench/ring_calls.py --out $OUT/calls.jsonl
    python3 bench/ring_calls.py --out /tmp/c.jsonl --size 256 --layers 2 --repeats 2 --device cpu   # a quick check
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from copy_gather import timed_graph
from regions import emit

from worker.group import ring_attention as ring
from worker.group.attention_merge import merge_attention, reference


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's attention on CUDA, the same formula in torch elsewhere (the quick check)."""
    if query.is_cuda:
        return ring.cudnn_attention(query, key, value)
    scores = (query.float() @ key.float().transpose(-1, -2)) / query.shape[-1] ** 0.5
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.softmax(scores, dim=-1) @ value.float()).to(query.dtype), lse


def ways(tokens: int, heads: int, dim: int, device: torch.device) -> dict[str, Callable[[], torch.Tensor]]:
    """Each way's one layer on a ring of 2, on the same queries (this rank's, the first half),
    keys and values; every way returns ``[batch, tokens, heads, dim]``."""
    torch.manual_seed(0)
    local = tokens // 2
    dtype = torch.bfloat16
    q_all, k_all, v_all = (torch.randn(1, tokens, heads, dim, device=device, dtype=dtype) for _ in range(3))
    # the product's layout: queries heads-first, each rank's keys and values in one heads-first buffer
    query = q_all[:, :local].transpose(1, 2).contiguous()
    parts = (slice(0, local), slice(local, 2 * local))
    buffers = [torch.stack([k_all[:, part].transpose(1, 2), v_all[:, part].transpose(1, 2)]) for part in parts]
    merge = merge_attention if device.type == "cuda" else reference
    q_view = q_all[:, :local].contiguous()

    def product() -> torch.Tensor:  # a ring of 2: this rank's keys, then the peer's, merged
        out, lse = attend(query, buffers[0][0], buffers[0][1])
        return merge(out, lse, *attend(query, buffers[1][0], buffers[1][1]))

    k_hf, v_hf = k_all.transpose(1, 2).contiguous(), v_all.transpose(1, 2).contiguous()

    def whole_heads_first() -> torch.Tensor:
        return attend(query, k_hf, v_hf)[0].transpose(1, 2)

    def whole_views() -> torch.Tensor:
        return attend(q_view.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2))[0].transpose(1, 2)

    q_full = q_all.transpose(1, 2).contiguous()

    def one_gpu_cudnn() -> torch.Tensor:
        return attend(q_full, k_hf, v_hf)[0].transpose(1, 2)

    def one_gpu_flash() -> torch.Tensor:
        if device.type != "cuda":
            return F.scaled_dot_product_attention(q_full, k_hf, v_hf).transpose(1, 2)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q_full, k_hf, v_hf).transpose(1, 2)

    return {
        "ring-product": product,
        "whole-heads-first": whole_heads_first,
        "whole-views": whole_views,
        "1gpu-cudnn": one_gpu_cudnn,
        "1gpu-flash": one_gpu_flash,
    }


def per_layer_ms(fn: Callable[[], torch.Tensor], layers: int, repeats: int, device: torch.device) -> float:
    """Median ms per call of ``repeats`` replays of one CUDA graph of ``layers`` calls (host time
    per call off CUDA)."""
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(layers):
                fn()
            times.append((time.perf_counter() - started) * 1e3 / layers)
        return statistics.median(times)
    return timed_graph(lambda: [fn() for _ in range(layers)], repeats, before=lambda: None) * 1e3 / layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", type=int, nargs="+", default=[1024, 2048], help="image sides (16 pixels a token)")
    parser.add_argument("--text", type=int, default=512, help="text tokens")
    parser.add_argument("--layers", type=int, default=57, help="calls in one graph (FLUX: 57 layers a step)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    for size in args.size:
        tokens = (size // 16) ** 2 + args.text
        found = ways(tokens, 24, 128, device)
        truth = found["1gpu-cudnn"]()[:, : tokens // 2].float()
        for name, fn in found.items():
            ms = per_layer_ms(fn, args.layers, args.repeats, device)
            diff = (fn()[:, : tokens // 2].float() - truth).abs().max().item()
            emit(
                args.out,
                {
                    "bench": "ring_calls",
                    "size": size,
                    "tokens": tokens,
                    "ranks": 2,
                    "way": name,
                    "ms_per_layer": round(ms, 4),
                    "s_per_image": round(ms * 57 * 28 / 1e3, 4),
                    "max_abs_diff_vs_1gpu": round(diff, 5),
                    "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                },
            )


if __name__ == "__main__":
    main()
