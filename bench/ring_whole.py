"""Experiment: the ring's attention as one cuDNN call over every rank's keys and values, after
the gather (``bench/group.py --ring-whole``; not the product's).

The product (``worker/group/ring_attention.py``) attends to its own keys while the peers' come,
then to each peer's, and merges the softmaxes by their log-sum-exp in fp32: two cuDNN calls of
half the keys each, and a merge that Inductor fuses into the kernel after the attention (in a
single-stream block the one that also applies the MLP's GELU: 0.105 s a rank at half the tokens
against 0.120 s on one GPU for all of them, ``fluxwhere``). The overlap it buys measured little
with this ring (``fluxring6``: 2.397 s overlapped, 2.388 s not). Here the rank waits for the
gather, lays every rank's keys and values side by side (a copy of 57 MB a layer at FLUX 1024²
on 2 ranks), and attends once: one call of twice the keys, no merge.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from worker.group import ring_attention as ring


def ring_attention_whole(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group: dist.ProcessGroup,
    gather: ring.Gather = ring.all_gather,
) -> torch.Tensor:
    """:func:`worker.group.ring_attention.ring_attention` as one attention over all the keys."""
    batch, tokens, heads, dim = key.shape
    query = query.transpose(1, 2).contiguous()
    kv = torch.cat([key.transpose(1, 2).flatten(), value.transpose(1, 2).flatten()])
    every = [kv, *gather(kv, group)()]
    every = [part.view(2, batch, heads, tokens, dim) for part in every]
    keys = torch.cat([part[0] for part in every], dim=2)
    values = torch.cat([part[1] for part in every], dim=2)
    out, _lse = ring.cudnn_attention(query, keys, values)
    return out.transpose(1, 2)


def use() -> None:
    """Every ring attention attends this way (the name is looked up at each call)."""
    ring.ring_attention = ring_attention_whole
