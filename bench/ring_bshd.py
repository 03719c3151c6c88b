"""Experiment: the ring's attention handed views of tokens-first memory (``bench/group.py
--ring-bshd``; not the product's: it made the same time).

The product (``worker/group/ring_attention.py``) copies the queries into cuDNN's ``[batch,
heads, tokens, dim]`` layout and transposes the keys and values into it in the gather's buffer.
cuDNN's attention reads any strides and writes its output in the query's layout, so this hands
it ``[batch, heads, tokens, dim]`` views of the ``[batch, tokens, heads, dim]`` tensors instead:
no copy of the queries, the keys and values stacked as they are, the output already in the order
the projection after it reads. Measured (FLUX 1024², ring of 2, 2 H200s, one call,
``h200x2-fluxring8-call.jsonl``; one GPU 3.917 s): 2.393 / 2.397 s against the product's 2.406 /
2.386 s, images within 7/255 of one GPU's (6/255). Profiled, its normalization kernels took
0.15 s a rank (0.17 s with the product's layout in ``fluxwhere``, other H200s), but the image
took no less.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from worker.group import ring_attention as ring
from worker.group.attention_merge import merge_pair


def ring_attention_bshd(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group: dist.ProcessGroup,
    gather: ring.Gather = ring.all_gather,
) -> torch.Tensor:
    """:func:`worker.group.ring_attention.ring_attention` on views of tokens-first memory."""
    batch, tokens, heads, dim = key.shape
    query = query.transpose(1, 2)
    kv = torch.stack([key, value])
    peers = gather(kv, group)
    out, lse = ring.cudnn_attention(query, kv[0].transpose(1, 2), kv[1].transpose(1, 2))
    out, lse = out.float(), lse.float().reshape(batch, heads, tokens, 1)
    for peer in peers():
        peer = peer.view(2, batch, tokens, heads, dim).transpose(2, 3)
        out, lse = merge_pair(out, lse, *ring.cudnn_attention(query, peer[0], peer[1]))
    return out.to(key.dtype).transpose(1, 2)


def use() -> None:
    """Every ring attention attends this way (the name is looked up at each call)."""
    ring.ring_attention = ring_attention_bshd
