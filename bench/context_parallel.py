"""diffusers' own context parallelism (Ulysses) for FLUX: a benchmark alternative to xDiT's split.

Why it is worth a call: xDiT's FLUX attention breaks Dynamo's graph at its all-to-alls (see
``worker/pipelines/speedups.py``), so under ``compile-blocks`` every block is several graphs and
the layout copies around each exchange run as kernels of their own (on 2 H100s FLUX at 1024²
makes 1.45× one GPU, where the issue asks 1.7×). diffusers 0.42's ``enable_parallelism`` splits
the same sequence (image and text tokens, and their rotary positions, over the ranks; the
output gathered after ``proj_out``) with functional collectives that Dynamo traces: a FLUX
block compiles with ``fullgraph=True`` (``tests/test_context_parallel.py``), so Inductor can fuse
those copies into the kernels around them, and with ``bench/group.py --comm-overlap`` move
compute between an all-to-all and its wait. Whether that is faster on H100s is for
``bash bench/group_device.sh fluxprofile`` to measure; the product's groups still split with xDiT.

With ``chunks`` above 1 the attention's exchange is ours (``ChunkedUlysses``): the heads go in
``chunks`` parts, every part's query/key/value all-to-all is issued before the first attention,
and each part's output goes back while the next part's attention runs, so the GPU computes while
NCCL sends (an eager 2-GPU profile on H200s had 0.34-0.99 s per image of all-to-all that compute
did not hide). diffusers' own exchange waits for each all-to-all where it is issued. Inductor
keeps that order: on 2 CPU ranks (2026-11-27, ``TORCH_LOGS=output_code``) a compiled single-stream
block with 2 parts issues both exchanges before the first attention, and under ``--comm-overlap``
runs the block's MLP between the last output exchange and its wait (without it, after the wait).

Every rank ends with the whole image (the gather is before the decoder), as under xDiT without
its parallel VAE.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections


@contextmanager
def _cpu_counts_as_one_device() -> Iterator[None]:
    """diffusers 0.42.1 places a rank on ``rank % torch.accelerator.device_count()``, which
    divides by zero on a machine without an accelerator (the CPU tests). There the device is the
    CPU whatever the rank, so the count is taken as 1 while the split is set up."""
    count = torch.accelerator.device_count
    if count() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = count  # type: ignore[assignment]


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


def install(pipe: Any, ulysses_degree: int, chunks: int = 0) -> None:
    """Split ``pipe``'s transformer over the default process group's ranks (all of them, in
    Ulysses); every rank calls this together, after the model is loaded and its levers applied
    (``compile-blocks`` traces lazily, so it compiles the split attention). ``chunks`` 0 keeps
    diffusers' attention exchange; 1 or more puts :class:`ChunkedUlysses` on every attention
    (diffusers still splits the tokens and gathers the output)."""
    from diffusers import ContextParallelConfig

    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise SystemExit("--diffusers-cp splits a DiT's transformer (FLUX); this pipeline has none")
    with _cpu_counts_as_one_device():
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree))
    if chunks:
        heads = transformer.config.num_attention_heads
        if heads % (chunks * ulysses_degree):
            raise SystemExit(f"--cp-chunks {chunks}: {heads} heads do not split in {chunks} parts of {ulysses_degree}")
        transformer.set_attn_processor(ChunkedUlysses(chunks))
