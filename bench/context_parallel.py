"""Two experiments on diffusers' Ulysses split of FLUX that lost: our exchange in parts
(``bench/group.py --cp-chunks N``) and the single-stream blocks' exchanges overlapped with their
MLP (``--overlap``).

The product splits a Ulysses-only FLUX group with diffusers' own context parallelism
(:mod:`worker.group.token_split`), whose exchange waits for each all-to-all where it is issued. With
``chunks`` parts (``ChunkedUlysses``) the heads go in parts: every part's query/key/value
all-to-all is issued before the first attention, and each part's output goes back while the next
part's attention runs. On 2 CPU ranks (2026-11-27, ``TORCH_LOGS=output_code``) a compiled
single-stream block with 2 parts issues both exchanges before the first attention, and under
``--comm-overlap`` runs the block's MLP between the last output exchange and its wait.

Measured on 2 H100s (2026-11-27, docs/benchmarks.md): it loses. FLUX 1024² took 4.23 s in 4
parts (2.83 s with ``--comm-overlap``) where diffusers' exchange took 2.62 s: the small
exchanges cost more than the compute they overlap.

Overlapped (:func:`overlap_exchanges`): a single-stream block's query, key and value go out
before its MLP projection, and attention's output comes back while the MLP's part of
``proj_out`` runs, in plain Python between compiled pieces (inside one compiled graph Inductor
waits for each exchange where it is issued and moves the MLP after attention, with or without
its comm-reordering passes: read in its output code on 2 CPU ranks, where the overlapped
blocks made the one-process image, eager and compiled, run as ``tests/test_context_parallel.py``
runs the parts). Measured on 2 H100s
(2026-11-27, ``fluxoverlap``, FLUX 1024², one call): 3.80 s against the plain split's 2.84 s,
and with one CUDA graph per transformer call 2.65 s against 2.59 s. So the kernels did not
overlap for less than they cost in sequence (pieces fuse less, ``proj_out`` runs as two GEMMs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from worker.group.ring_attention import FluxAttentionAround


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


class ChunkedUlysses(FluxAttentionAround):
    """diffusers' FLUX attention with :func:`ulysses_attention` for the attention itself."""

    def __init__(self, chunks: int) -> None:
        super().__init__()
        self.chunks = chunks

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return ulysses_attention(query, key, value, self.chunks)


def exchange_in_parts(pipe: Any, ulysses_degree: int, chunks: int) -> None:
    """Put :class:`ChunkedUlysses` on every attention of ``pipe``'s transformer, already split
    by :func:`worker.group.token_split.split` (which still splits the tokens and gathers the output)."""
    transformer = pipe.transformer
    heads = transformer.config.num_attention_heads
    if heads % (chunks * ulysses_degree):
        raise SystemExit(f"--cp-chunks {chunks}: {heads} heads do not split in {chunks} parts of {ulysses_degree}")
    transformer.set_attn_processor(ChunkedUlysses(chunks))


def _prepare(
    block: Any,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None,
    world: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Up to the exchange: the block's input, its normed form, the gate, and the query, key and
    value laid out to send (rank ``w`` gets heads ``w·H/world ...`` of every rank's tokens, the
    order diffusers' Ulysses uses)."""
    from diffusers.models.embeddings import apply_rotary_emb

    hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    normed, gate = block.norm(hidden_states, emb=temb)
    attn = block.attn
    sends = []
    for project, norm in ((attn.to_q, attn.norm_q), (attn.to_k, attn.norm_k), (attn.to_v, None)):
        x = project(normed).unflatten(-1, (-1, attn.head_dim))
        if norm is not None:
            x = norm(x)
            if image_rotary_emb is not None:
                x = apply_rotary_emb(x, image_rotary_emb, sequence_dim=1)
        batch, tokens, heads, dim = x.shape
        x = x.reshape(batch, tokens, world, heads // world, dim).permute(2, 1, 0, 3, 4)
        sends.append(x.contiguous().flatten())
    return hidden_states, normed, gate, sends


def _mlp(block: Any, normed: torch.Tensor) -> torch.Tensor:
    return block.act_mlp(block.proj_mlp(normed))


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    world: int,
    batch: int,
    tokens: int,
    heads: int,
    dim: int,
) -> torch.Tensor:
    """Attention over every rank's tokens with this rank's heads, laid out to send back (rank
    ``w`` gets its own tokens)."""
    mine = heads // world
    query, key, value = (  # [source rank: its tokens, tokens, batch, mine, dim] -> [batch, mine, all tokens, dim]
        x.view(world, tokens, batch, mine, dim).permute(2, 3, 0, 1, 4).reshape(batch, mine, world * tokens, dim)
        for x in (query, key, value)
    )
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value)
    return out.reshape(batch, mine, world, tokens, dim).permute(2, 1, 0, 3, 4).contiguous().flatten()


def _mlp_out(block: Any, mlp: torch.Tensor) -> torch.Tensor:
    """The MLP's part of ``proj_out`` (over ``[attention, mlp]`` it is the sum of two column blocks)."""
    return torch.nn.functional.linear(
        mlp, block.proj_out.weight[:, block.proj_out.in_features - block.mlp_hidden_dim :]
    )


def _finish(
    block: Any,
    residual: torch.Tensor,
    gate: torch.Tensor,
    projected: torch.Tensor,
    received: torch.Tensor,
    world: int,
    heads: int,
    dim: int,
    text_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, tokens, _ = residual.shape
    attended = received.view(world, heads // world, batch, tokens, dim)  # [source rank: its heads, ...]
    attended = attended.permute(2, 3, 0, 1, 4).reshape(batch, tokens, heads * dim)
    weight = block.proj_out.weight[:, : block.proj_out.in_features - block.mlp_hidden_dim]
    projected = projected + torch.nn.functional.linear(attended, weight, block.proj_out.bias)
    hidden_states = residual + gate.unsqueeze(1) * projected
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    return hidden_states[:, :text_tokens], hidden_states[:, text_tokens:]


@dataclass(frozen=True)
class _Pieces:
    """The single-stream block's compute between its exchanges."""

    prepare: Callable[..., Any]
    mlp: Callable[..., Any]
    attend: Callable[..., Any]
    mlp_out: Callable[..., Any]
    finish: Callable[..., Any]


@cache
def _pieces(compiled: bool) -> _Pieces:
    """Each piece compiled once for every block (their weights are the graph's inputs), or eager."""
    pieces = (_prepare, _mlp, _attend, _mlp_out, _finish)
    if compiled:
        pieces = tuple(torch.compile(piece, fullgraph=True, dynamic=False) for piece in pieces)
    return _Pieces(*pieces)


def _waited(sent: torch.Tensor) -> torch.Tensor:
    """The exchange's result once this stream has waited for it."""
    import torch.distributed._functional_collectives as funcol

    return sent.wait() if isinstance(sent, funcol.AsyncCollectiveTensor) else sent


def _overlapped_single_block(
    self: Any,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    temb: torch.Tensor,
    image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    joint_attention_kwargs: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """diffusers' ``FluxSingleTransformerBlock.forward`` under Ulysses with its exchanges
    overlapped: the query, key and value go out before the MLP's projection, which runs while
    they travel, and attention's output comes back while the MLP's part of ``proj_out`` runs.
    Plain Python between compiled pieces, so the order is this one: inside one compiled graph
    Inductor waits for each exchange where it is issued and moves the MLP after attention
    (read in its output code on 2 CPU ranks, with and without its comm-reordering passes)."""
    import torch.distributed._functional_collectives as funcol

    if joint_attention_kwargs:
        raise ValueError(f"the overlapped FLUX block takes no attention arguments: {sorted(joint_attention_kwargs)}")
    pieces: _Pieces = self._diffq_pieces
    group = self.attn.processor._parallel_config.context_parallel_config._ulysses_mesh.get_group()
    world = torch.distributed.get_world_size(group)
    heads, dim = self.attn.heads, self.attn.head_dim
    residual, normed, gate, sends = pieces.prepare(
        self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, world
    )
    flying = [funcol.all_to_all_single(x, None, None, group) for x in sends]
    mlp = pieces.mlp(self, normed)  # while the query, key and value travel
    batch, tokens, _ = normed.shape
    out = pieces.attend(*(_waited(x) for x in flying), world, batch, tokens, heads, dim)
    back = funcol.all_to_all_single(out, None, None, group)
    projected = pieces.mlp_out(self, mlp)  # while attention's output travels
    return pieces.finish(
        self, residual, gate, projected, _waited(back), world, heads, dim, encoder_hidden_states.shape[1]
    )


def overlap_exchanges(pipe: Any, compiled: bool) -> int:
    """Give every single-stream block of ``pipe``'s split transformer the overlapped forward
    (:func:`_overlapped_single_block`), its pieces compiled when ``compiled`` (the group's
    ``compile-blocks``: a block compiled whole is uncompiled here, its graph would wait for
    each exchange where it is issued). Returns how many blocks took it."""
    import types

    blocks = pipe.transformer.single_transformer_blocks
    for block in blocks:
        block._compiled_call_impl = None  # nn.Module.compile's wrapper: the block runs its forward again
        block._diffq_pieces = _pieces(compiled)
        block.forward = types.MethodType(_overlapped_single_block, block)
    return len(blocks)
