"""A token-split group's decoder split by rows over its ranks, exactly.

Why: every rank of a FLUX Ulysses or ring group ends with the whole latent, and each decoded all
of it: 0.09 s of a ring rank's 2.4 s image at 1024² on 2 H200s (``fluxwhere``), four times that
at 2048², work one GPU does once and a group did on every rank.

How: rank r decodes rows ``[r·h, (r+1)·h)`` of the latent and the ranks gather the image's rows.
What would make a rank's half differ from the same rows of the whole decode is replaced:
- a 3×3 convolution reads one row beyond each edge: the ranks swap their edge rows first and
  pad with their neighbour's (zeros at the image's edges, as the convolution's own padding);
- a GroupNorm's statistics are over the whole image: each rank sums its rows (fp32), the sums
  are all-reduced, the mean first and then the variance about it (eager, in parts of the
  groups at a 2048² image's largest activations: no fp32 copy of the whole activation);
- the middle block's attention attends every token: its keys and values are gathered.
1×1 convolutions, nearest-neighbour upsampling, SiLU and the residual adds are row by row.

The replaced modules live in a twin of the decoder that shares its weights: the decoder itself
stays as it was, compiled or not, for whole decodes (a latent whose rows do not divide by the
ranks decodes whole on every rank, and inside :func:`alone` a rank decodes its own images by
itself: an SDXL CFG pair's even part). Where the decoder was compiled (``compile-vae``), the twin
is compiled too, its collectives inside the one graph.

Measured (FLUX 1024², ring of 2, 2 H200s, one call, ``fluxdecode``, alternated; eager, each 3×3
convolution's input then padded by concatenation, a copy the edge rows' recomputation replaced:
on one H200 a one-rank twin took 37.57 ms where the compiled decoder took 37.39, 42.87 against
36.81 by concatenation, ``pairparts``): 2.390 / 2.352 s
an image against 2.438 / 2.408 s with every rank decoding all of it (one GPU 3.976 s); images
within 6/255 of one GPU's either way; peak memory 34.30 GiB against 33.92, and 42.55 GiB at 2048²
against 41.06 with whole decodes (2 H100s, ``fluxring5``): the GroupNorm's fp32 copies of the
largest activations outweighed the half rows. Without them (one H200, ``decodemem``, FLUX's
decoder at 2048² in bf16) a rank peaks 4.8 GiB above its inputs where the whole decode peaks
9.5 GiB (11.0 GiB with the copies), in 140 ms against 171 ms with the copies and 397 ms whole.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from worker.pipelines.precompiled import Precompiled

log = logging.getLogger("diffq.group")


class _Split:
    """What the replaced modules share: the group, and this rank's place in it."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[world, *x.shape]``: every rank's ``x``, in rank order."""
        out = x.new_empty(self.world * x.numel())
        dist.all_gather_into_tensor(out, x.contiguous().flatten(), group=self.group)
        return out.view(self.world, *x.shape)


class _HaloConv(nn.Module):
    """A 3×3, stride 1, padding 1 convolution over rows split across the ranks."""

    def __init__(self, conv: nn.Conv2d, split: _Split) -> None:
        super().__init__()
        self.conv, self.split = conv, split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        split, conv = self.split, self.conv
        edges = split.gather(torch.stack([x[:, :, :1], x[:, :, -1:]]))  # [world, top/bottom, B, C, 1, W]
        first, last = split.rank == 0, split.rank == split.world - 1
        if x.shape[2] < 2:  # one row: pad it with both neighbours' rows
            zeros = torch.zeros_like(x[:, :, :1])
            above = zeros if first else edges[split.rank - 1, 1]
            below = zeros if last else edges[split.rank + 1, 0]
            return F.conv2d(torch.cat([above, x, below], dim=2), conv.weight, conv.bias, padding=(0, 1))
        # the convolution as the whole decode runs it (its own zero padding), then the edge rows a
        # neighbour's row reaches again: no copy of the whole activation to pad it
        out = conv(x)
        if not first:
            above = torch.cat([edges[split.rank - 1, 1], x[:, :, :2]], dim=2)
            out[:, :, :1] = F.conv2d(above, conv.weight, conv.bias, padding=(0, 1))
        if not last:
            below = torch.cat([x[:, :, -2:], edges[split.rank + 1, 0]], dim=2)
            out[:, :, -1:] = F.conv2d(below, conv.weight, conv.bias, padding=(0, 1))
        return out


class _SplitGroupNorm(nn.Module):
    """GroupNorm whose statistics are the whole image's: ``[B, C, ...]`` rows split across ranks.

    Eager, it holds one fp32 copy of some of its groups at a time (at most ``part_bytes``):
    computed over the whole activation at once, its fp32 copies (the upcast, the centred values,
    their squares, the affine's products) held ten times the input's bytes, and a rank's split
    decode at 2048² peaked 1.5 GiB above a whole decode's (2 H100s, ``fluxring5``). Its sums are
    ``torch.sum`` reductions, which spread a group over many blocks: ATen's GroupNorm gives each
    (image, group) one block, 32 blocks for one image (``RowwiseMomentsCUDAKernel``: 0.05 s of
    the 0.09 s whole decode each ring rank ran before the split). Compiled, Inductor fuses the
    plain formulation into reductions and one pointwise kernel, with no copy.
    """

    #: eager: the most bytes of fp32 centred values held at once (a 2048² image's largest
    #: activations go in parts; at 1024² parts cost more launches than they save memory)
    part_bytes = 256 * 2**20

    def __init__(self, norm: nn.GroupNorm, split: _Split) -> None:
        super().__init__()
        self.norm, self.split = norm, split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return self._fused(x)
        norm, group = self.norm, self.split.group
        batch, channels = x.shape[:2]
        groups = norm.num_groups
        grouped = x.reshape(batch, groups, -1)
        count = grouped.shape[-1] * self.split.world  # every rank holds as many rows
        parts = min(groups, -(-x.numel() * 4 // self.part_bytes))
        step = -(-groups // parts)
        slices = [slice(g, g + step) for g in range(0, groups, step)]
        # a half-precision sum accumulates in fp32 on CUDA without a copy of its input
        sums = torch.cat([grouped[:, p].sum(-1, dtype=torch.float32) for p in slices], 1)  # [B, G]
        dist.all_reduce(sums, group=group)
        mean = sums / count
        norms = [torch.linalg.vector_norm(grouped[:, p] - mean[:, p, None], dim=-1) for p in slices]
        var = torch.cat(norms, 1).square_()
        dist.all_reduce(var, group=group)
        # (x - mean) * rstd * weight + bias as x * scale + shift, per channel, computed in fp32
        # and written in x's dtype by one kernel
        per_group = channels // groups
        scale = torch.rsqrt(var / count + norm.eps).repeat_interleave(per_group, 1)  # [B, C]
        shift = -mean.repeat_interleave(per_group, 1) * scale
        if norm.affine:
            scale = scale * norm.weight.float()
            shift = shift * norm.weight.float() + norm.bias.float()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        flat = out.view(batch, channels, -1)
        torch.addcmul(shift[..., None], x.reshape(batch, channels, -1), scale[..., None], out=flat)
        return out

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        norm, group = self.norm, self.split.group
        batch, channels = x.shape[:2]
        grouped = x.float().reshape(batch, norm.num_groups, -1)
        count = grouped.shape[-1] * self.split.world
        sums = grouped.sum(-1, keepdim=True)
        dist.all_reduce(sums, group=group)
        centred = grouped - sums / count
        var = (centred * centred).sum(-1, keepdim=True)
        dist.all_reduce(var, group=group)
        out = centred * torch.rsqrt(var / count + norm.eps)
        out = out.view(batch, channels, -1)
        if norm.affine:
            out = out * norm.weight.float().view(1, channels, 1) + norm.bias.float().view(1, channels, 1)
        return out.view(x.shape).to(x.dtype)


class _GatherTokens(nn.Module):
    """A key or value projection of ``[B, tokens, C]`` whose output holds every rank's tokens."""

    def __init__(self, linear: nn.Module, split: _Split) -> None:
        super().__init__()
        self.linear, self.split = linear, split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x)
        every = self.split.gather(out)  # [world, B, tokens, C]
        return every.transpose(0, 1).flatten(1, 2)


class _RowSplitDecoder(nn.Module):
    """The decoder, called with the whole latent: each rank decodes its rows with the twin, and
    every rank returns the whole image. The decoder itself decodes what does not split, and
    whatever a rank decodes :func:`alone`."""

    def __init__(self, decoder: nn.Module, twin: nn.Module, split: _Split) -> None:
        super().__init__()
        self.decoder, self.twin, self.split = decoder, twin, split
        self.alone = False

    def forward(self, z: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        split = self.split
        rows = z.shape[2]
        if self.alone or rows % split.world:
            return self.decoder(z, *args, **kwargs)
        share = rows // split.world
        mine = self.twin(z[:, :, split.rank * share : (split.rank + 1) * share], *args, **kwargs)
        every = split.gather(mine)  # [world, B, C, h, W]
        return every.permute(1, 2, 0, 3, 4).flatten(2, 3)


#: the convolutions a row split takes: 1×1, and 3×3 with stride 1 and one row of zero padding
_ROW_LOCAL = ((1, 1), (1, 1), (0, 0), (1, 1), 1, "zeros")
_HALO = ((3, 3), (1, 1), (1, 1), (1, 1), 1, "zeros")


def _takes(decoder: nn.Module) -> bool:
    """Whether every convolution of ``decoder`` is one the split takes."""
    shapes = {_ROW_LOCAL, _HALO}
    return all(
        (m.kernel_size, m.stride, m.padding, m.dilation, m.groups, m.padding_mode) in shapes
        for m in decoder.modules()
        if isinstance(m, nn.Conv2d)
    )


def _replace(parent: nn.Module, split: _Split) -> None:
    for name, child in parent.named_children():
        if isinstance(child, nn.Conv2d) and child.kernel_size == (3, 3):
            setattr(parent, name, _HaloConv(child, split))
        elif isinstance(child, nn.GroupNorm):
            setattr(parent, name, _SplitGroupNorm(child, split))
        elif type(child).__name__ == "Attention" and hasattr(child, "to_k"):
            child.to_k = _GatherTokens(child.to_k, split)
            child.to_v = _GatherTokens(child.to_v, split)
            _replace(child, split)
        else:
            _replace(child, split)


def _twin(decoder: nn.Module) -> nn.Module:
    """A copy of ``decoder``'s modules holding the same parameters and buffers (no memory), without
    its compiled forward."""
    shared: dict[int, Any] = {id(t): t for t in itertools.chain(decoder.parameters(), decoder.buffers())}
    own = dict(decoder.__dict__)
    decoder.__dict__.pop("forward", None)  # a precompiled forward: the class's is what the twin runs
    decoder.__dict__["_compiled_call_impl"] = None
    try:
        return copy.deepcopy(decoder, shared)
    finally:
        decoder.__dict__.clear()
        decoder.__dict__.update(own)


def _compiled(decoder: nn.Module) -> bool:
    """Whether ``compile-vae`` compiled ``decoder`` (lazily, or into precompiled files)."""
    return (
        isinstance(decoder.__dict__.get("forward"), Precompiled)
        or decoder.__dict__.get("_compiled_call_impl") is not None
    )


def install(vae: Any, group: dist.ProcessGroup) -> bool:
    """Split ``vae``'s decoder by rows over ``group`` (all ranks call this together, and every
    decode after it on all ranks together, except inside :func:`alone`). Returns False, changing
    nothing, for a decoder with a layer this split does not take."""
    decoder = vae.decoder
    if isinstance(decoder, _RowSplitDecoder) or not _takes(decoder):
        return False
    split = _Split(group)
    twin = _twin(decoder)
    _replace(twin, split)
    if _compiled(decoder):
        # one graph with the collectives inside (Dynamo traces c10d's in-place collectives as
        # functional ones); not a precompiled file: the graph names this process's group
        twin.compile(fullgraph=True, dynamic=False)
        log.info("the decoder split by rows: its twin compiles with the collectives inside")
    vae.decoder = _RowSplitDecoder(decoder, twin, split)
    return True


@contextmanager
def alone(vae: Any) -> Iterator[None]:
    """Inside: this rank decodes whole what it decodes, by itself (no collective); outside a
    split decoder, nothing changes."""
    decoder = vae.decoder
    if not isinstance(decoder, _RowSplitDecoder):
        yield
        return
    decoder.alone = True
    try:
        yield
    finally:
        decoder.alone = False
