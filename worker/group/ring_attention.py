"""A ring group's attention: each rank's queries against every rank's keys and values.

diffusers' own ring (``TemplatedRingAttention`` under its ``_native_cudnn`` backend) copies each
layer's keys and values three times on their way: into one buffer for the gather, into cuDNN's
``[batch, heads, tokens, dim]`` layout for the local attention, and again, out of the gathered
buffer, for the peers'. Under the profiler (2 H100s, FLUX 1024², 2026-11-28, ``fluxring3``) a
ring rank's elementwise kernels took 0.28 s an image where one GPU's took 0.27 s for twice the
tokens. Here the keys and values are laid out once, in cuDNN's layout, in the buffer the gather
sends: the local attention reads its halves in place and each peer's arrive ready to attend
(read in Inductor's output code on 2 CPU ranks: no copy between the gather and either
attention). Measured in one call (2 H100s, FLUX 1024², ``fluxring4``): 2.416 s an image where
diffusers' ring took 2.458 s and one GPU 3.894 s; the elementwise kernels 0.21 s a rank.

The rest is the same arithmetic: attend to the local keys while the peers' come (Inductor's
``raise_comms`` and ``sink_waits`` passes, set by :mod:`worker.group.token_split`, issue the
gather before the local attention and wait after it), then to each peer's, and merge the
softmaxes by their log-sum-exp in fp32; the last merge is one kernel that writes the model's
layout (:mod:`worker.group.attention_merge`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections

from worker.group.attention_merge import merge_attention, merge_pair


def cudnn_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` for ``[batch, heads, tokens, dim]`` inputs: cuDNN's attention, which
    returns the log-sum-exp the merge needs (the tests put a CPU twin here)."""
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(query, key, value, None, True, 0.0, False, False)
    return out, lse


#: how a ring rank gets its peers' keys and values: called with this rank's buffer as soon as it
#: exists, it returns what gives the peers' buffers (this rank's next first) where they are first
#: read, after the local attention
Gather = Callable[[torch.Tensor, dist.ProcessGroup], Callable[[], list[torch.Tensor]]]

#: the last merge: ``(out, lse, other, other_lse)`` to ``[batch, tokens, heads, dim]`` in the
#: model's dtype (the bench puts :func:`worker.group.attention_merge.reference` here to measure
#: the merge fused by the compiler, as it was)
merge_last: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = merge_attention


def all_gather(kv: torch.Tensor, group: dist.ProcessGroup) -> Callable[[], list[torch.Tensor]]:
    """The process group's all-gather (NCCL's kernels on GPUs): issued here, waited for at first
    use. The bench's pull by the copy engines (``bench/peer_gather.py``) made the same time."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    gathered = funcol.all_gather_tensor(kv, 0, group)

    def peers() -> list[torch.Tensor]:
        everyone = gathered.view(world, *kv.shape)
        return [everyone[(rank + step) % world] for step in range(1, world)]

    return peers


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    group: dist.ProcessGroup,
    gather: Gather = all_gather,
) -> torch.Tensor:
    """Attention of this rank's ``[batch, tokens, heads, dim]`` queries over every rank's keys
    and values (the group's ranks hold the tokens in rank order; attention does not care about
    the keys' order), to the queries' shape."""
    batch, tokens, heads, dim = key.shape
    query = query.transpose(1, 2).contiguous()
    # one buffer, written once: the gather sends it, the local attention reads its halves in place
    kv = torch.cat([key.transpose(1, 2).flatten(), value.transpose(1, 2).flatten()])
    peers = gather(kv, group)
    kv = kv.view(2, batch, heads, tokens, dim)
    out, lse = cudnn_attention(query, kv[0], kv[1])
    *earlier, last = [peer.view(2, batch, heads, tokens, dim) for peer in peers()]
    if earlier:  # rings of 3 and more: all but the last merge in fp32
        out, lse = out.float(), lse.float().reshape(batch, heads, tokens, 1)
        for peer in earlier:
            out, lse = merge_pair(out, lse, *cudnn_attention(query, peer[0], peer[1]))
    return merge_last(out, lse, *cudnn_attention(query, last[0], last[1]))


class FluxAttentionAround(FluxAttnProcessor):
    """diffusers' FLUX attention (projections, QK norms, text before image, rotary positions,
    output projections) around :meth:`attend`, which a split replaces: the one place that knows
    FLUX's layout, for the ring here and for the bench's Ulysses in parts."""

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``[batch, tokens, heads, dim]`` in and out."""
        raise NotImplementedError

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: Any = None,
    ) -> Any:
        if attention_mask is not None:
            raise ValueError(f"{type(self).__name__}: FLUX attends without a mask; this call has one")
        query, key, value, encoder_query, encoder_key, encoder_value = _get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query, key, value = (x.unflatten(-1, (-1, attn.head_dim)) for x in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if attn.added_kv_proj_dim is not None:
            encoder_query, encoder_key, encoder_value = (
                x.unflatten(-1, (-1, attn.head_dim)) for x in (encoder_query, encoder_key, encoder_value)
            )
            encoder_query, encoder_key = attn.norm_added_q(encoder_query), attn.norm_added_k(encoder_key)
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        hidden_states = self.attend(query, key, value).flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
        return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())


class RingAttention(FluxAttentionAround):
    """FLUX's attention with :func:`ring_attention` over ``group`` for the attention itself.
    diffusers' split still cuts the transformer's input tokens and gathers its output."""

    def __init__(self, group: dist.ProcessGroup, gather: Gather = all_gather) -> None:
        super().__init__()
        self.group, self.gather = group, gather

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return ring_attention(query, key, value, self.group, self.gather)
