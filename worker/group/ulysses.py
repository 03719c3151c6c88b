"""FLUX split over a group's ranks with diffusers' own Ulysses (context parallelism).

diffusers 0.42's ``enable_parallelism`` splits the sequence (image and text tokens with their
rotary positions; the output gathered after ``proj_out``) with functional collectives that
Dynamo traces: a block compiles as one graph with its all-to-alls inside. Why not xDiT's split
here (2 H100s, 2026-11-27, docs/groups.md): per image, the all-to-alls took 0.30 s of kernel
time against xDiT's 0.56 s on the rank that waited least, and the elementwise kernels 0.17 s
against 0.31 s; FLUX at 1024² took 2.62 and 2.69 s against xDiT's 2.84 and 2.82 s in two calls,
3.04 against 2.86 s in a third whose runs were all slower and spread by up to 0.4 s. With one
CUDA graph per transformer call (a benchmark switch) it took 2.52-2.59 s, the fastest measured.

xDiT still splits what this does not take: ring attention, PipeFusion, its parallel VAE, and
Ulysses beside data parallelism (those were measured under xDiT only).

Every rank ends with the whole latent and decodes it (as under xDiT without its parallel VAE);
rank 0 answers with the images.

diffusers' split is exact: the heads, the text tokens and each job's image tokens must divide by
the degree (else it fails inside the first step). The first two are checked when the group
starts, the image tokens when a job comes (a size that does not split is that job's permanent
failure, with the sizes that do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from common.errors import ConfigError, PermanentJobError
from worker.group.config import GroupLayout
from worker.pipelines.generate import FLUX_TEXT_TOKENS


def takes(layout: GroupLayout) -> bool:
    """Whether this split serves ``layout``: Ulysses over every rank and nothing else."""
    return (
        layout.ulysses_degree > 1
        and layout.ring_degree == 1
        and layout.pipefusion_degree == 1
        and layout.data_parallel_degree == 1
        and not layout.parallel_vae
        and not layout.cfg_parallel
    )


@contextmanager
def _cpu_counts_as_one_device() -> Iterator[None]:
    """diffusers 0.42.1 places a rank on ``rank % torch.accelerator.device_count()``, which
    divides by zero on a machine without an accelerator (the CPU groups of the tests). There the
    device is the CPU whatever the rank, so the count reads 1 while the split is set up."""
    count = torch.accelerator.device_count
    if count() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = count  # type: ignore[assignment]


def split(pipe: Any, ulysses_degree: int, model: str) -> None:
    """Split ``pipe``'s transformer over the default process group's ranks; every rank calls
    this together, after the model is loaded with its levers (``compile-blocks`` traces on the
    first call, so it compiles the split attention)."""
    from diffusers import ContextParallelConfig

    heads = pipe.transformer.config.num_attention_heads
    for count, what in ((heads, "attention heads"), (FLUX_TEXT_TOKENS, "text tokens per prompt")):
        if count % ulysses_degree:
            raise ConfigError(
                f"--ulysses-degree {ulysses_degree}: {model} has {count} {what}, which do not split over "
                f"{ulysses_degree} ranks; use a degree that divides both {heads} and {FLUX_TEXT_TOKENS}"
            )
    with _cpu_counts_as_one_device():
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree))


def check_size(pipe: Any, ulysses_degree: int, width: int, height: int) -> None:
    """Refuse a job whose image tokens do not split over the ranks (FLUX packs 2×2 latent pixels
    into one token), before any rank computes."""
    side = pipe.vae_scale_factor * 2
    tokens = (width // side) * (height // side)
    if tokens % ulysses_degree:
        raise PermanentJobError(
            f"{width}x{height} makes {tokens} image tokens ({width // side}x{height // side}), which do not "
            f"split over this group's {ulysses_degree} Ulysses ranks; use a width and height whose "
            f"tokens divide by {ulysses_degree} (1024x1024 makes 4096), or a queue of single-GPU workers"
        )


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
