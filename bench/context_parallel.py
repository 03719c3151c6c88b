"""Our Ulysses exchange in parts, on diffusers' split of FLUX (``bench/group.py --cp-chunks N``).

The product splits a Ulysses-only FLUX group with diffusers' own context parallelism
(:mod:`worker.group.ulysses`), whose exchange waits for each all-to-all where it is issued. With
``chunks`` parts (``ChunkedUlysses``) the heads go in parts: every part's query/key/value
all-to-all is issued before the first attention, and each part's output goes back while the next
part's attention runs. On 2 CPU ranks (2026-11-27, ``TORCH_LOGS=output_code``) a compiled
single-stream block with 2 parts issues both exchanges before the first attention, and under
``--comm-overlap`` runs the block's MLP between the last output exchange and its wait.

Measured on 2 H100s (2026-11-27, docs/benchmarks.md): it loses. FLUX 1024² took 4.23 s in 4
parts (2.83 s with ``--comm-overlap``) where diffusers' exchange took 2.62 s: the small
exchanges cost more than the compute they overlap.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections


def ulysses_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, chunks: int) -> torch.Tensor:
    """Attention over every rank's tokens, from this rank's ``[batch, tokens, heads, dim]``
    query/key/value (all heads) to the same shape. Each rank attends with ``heads / world`` of
    every part's heads over all tokens (ordered by rank: the same for keys and queries, and
    attention does not care about the order of the keys)."""
    group = dist.group.WORLD
    world = dist.get_world_size(group)
    batch, tokens, heads, dim = query.shape
    per = heads // chunks  # heads in a part
    mine = per // world  # of them, those this rank attends with
    sent = []
    for c in range(chunks):  # every part's exchange goes out before the first attention
        part = torch.stack([x[:, :, c * per : (c + 1) * per] for x in (query, key, value)])
        part = part.reshape(3, batch, tokens, world, mine, dim).permute(3, 0, 1, 2, 4, 5).contiguous()
        sent.append(funcol.all_to_all_single(part.flatten(), None, None, group))
    back = []
    for received in sent:  # [source rank (its tokens), q/k/v, batch, tokens, mine, dim]
        qkv = received.view(world, 3, batch, tokens, mine, dim).permute(1, 2, 4, 0, 3, 5)
        q, k, v = qkv.reshape(3, batch, mine, world * tokens, dim).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)  # [batch, mine, world * tokens, dim]
        out = out.reshape(batch, mine, world, tokens, dim).permute(2, 0, 3, 1, 4).contiguous()
        back.append(funcol.all_to_all_single(out.flatten(), None, None, group))
    parts = [  # [source rank (its heads), batch, tokens, mine, dim] -> [batch, tokens, per, dim]
        out.view(world, batch, tokens, mine, dim).permute(1, 2, 0, 3, 4).reshape(batch, tokens, per, dim)
        for out in back
    ]
    return torch.cat(parts, dim=2)


class ChunkedUlysses(FluxAttnProcessor):
    """diffusers' FLUX attention (projections, QK norms, text before image, rotary positions,
    output projections) with :func:`ulysses_attention` for the attention itself."""

    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: Any = None,
    ) -> Any:
        if attention_mask is not None:
            raise ValueError("ChunkedUlysses: FLUX attends without a mask; this call has one")
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
        hidden_states = ulysses_attention(query, key, value, self.chunks).flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is None:
            return hidden_states
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [encoder_hidden_states.shape[1], hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
        return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())


def exchange_in_parts(pipe: Any, ulysses_degree: int, chunks: int) -> None:
    """Put :class:`ChunkedUlysses` on every attention of ``pipe``'s transformer, already split
    by :func:`worker.group.ulysses.split` (which still splits the tokens and gathers the output)."""
    transformer = pipe.transformer
    heads = transformer.config.num_attention_heads
    if heads % (chunks * ulysses_degree):
        raise SystemExit(f"--cp-chunks {chunks}: {heads} heads do not split in {chunks} parts of {ulysses_degree}")
    transformer.set_attn_processor(ChunkedUlysses(chunks))
