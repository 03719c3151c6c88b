"""``empty-negative``: an empty negative prompt's half of the batch skips cross-attention.

Why: SDXL's pipeline encodes an empty negative prompt as zeros (``force_zeros_for_empty_prompt``,
on in SDXL's own config), and each of the UNet's 70 cross-attention layers projects those zeros
to keys and values by linear layers without a bias: all zero. Every query of the unconditional
rows then averages zero values, and the layer's output is what its output projection makes of
zero, for every token, whatever the latent. Computing it is half of the batch's cross-attention
query projections, attention and output projections, spent on a known constant. With this lever
the conditional rows alone go through the layer's own processor, and the unconditional rows get
the output projection of one zero row: the same layer, the same arithmetic, so the images are
the ones without the lever (docs/benchmarks.md has what it saves).

How a batch says it: its number of zero rows travels as ``cross_attention_kwargs={"zero_rows":
n}`` (:func:`kwargs`), a plain argument of the UNet's call, so a compiled graph, a precompiled
file and a CUDA graph are each specialised on it as on a shape, and a batch with a negative
prompt runs the full graph. A layer where the premise does not hold (a key or value projection
with a bias, a norm on the text, a mask) runs in full whatever the argument says.
"""

from __future__ import annotations

from typing import Any

import torch

#: the ``cross_attention_kwargs`` entry: how many leading rows of the batch have zero text states
ZERO_ROWS = "zero_rows"


class EmptyNegativeProcessor:
    """Stands in for one attention layer's processor; every layer of the UNet gets one (a
    self-attention's passes straight through) so that none warns of an argument it does not know."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        zero_rows: int = 0,
    ) -> torch.Tensor:
        full = not zero_rows or encoder_hidden_states is None or attention_mask is not None
        if full or not exact(attn, hidden_states):
            return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb)
        zero_rows = min(zero_rows, hidden_states.shape[0])
        rows, tokens = hidden_states.shape[:2]
        # what the layer makes of an attention output of zero: its output projection of a zero row
        out = attn.to_out[0]
        constant = attn.to_out[1](out(hidden_states.new_zeros(1, 1, out.in_features)))
        zeros = constant.expand(zero_rows, tokens, constant.shape[-1])
        if zero_rows == rows:  # a CFG pair's unconditional rank holds only such rows
            return zeros.contiguous()
        given = self.inner(attn, hidden_states[zero_rows:], encoder_hidden_states[zero_rows:], None, temb)
        return torch.cat([zeros.to(given.dtype), given])


def exact(attn: Any, hidden_states: torch.Tensor) -> bool:
    """Whether zero text states give this layer zero keys and values and nothing else on top:
    projections without a bias (an adapter that adds one makes them non-zero), no norm of the
    text or the keys, no residual or rescale, token rows in (SDXL's transformer blocks)."""
    projections = 0  # a plain loop: what Dynamo traces in every torch the worker takes
    for name in ("to_k", "to_v", "to_kv"):
        layer = getattr(attn, name, None)
        if layer is not None:
            if getattr(layer, "bias", None) is not None:
                return False
            projections += 1
    return (
        projections > 0
        and not attn.norm_cross
        and getattr(attn, "norm_k", None) is None
        and attn.spatial_norm is None
        and attn.group_norm is None
        and not attn.residual_connection
        and attn.rescale_output_factor == 1.0
        and hidden_states.ndim == 3
    )


def install(unet: torch.nn.Module) -> None:
    """Wrap every attention layer's processor (after any lever that sets processors, such as
    ``fuse-qkv``, and before the compile)."""
    from diffusers.models.attention_processor import Attention

    for module in unet.modules():
        if isinstance(module, Attention) and not isinstance(module.processor, EmptyNegativeProcessor):
            module.set_processor(EmptyNegativeProcessor(module.processor))
    unet._diffq_empty_negative = True  # what :func:`kwargs` asks, once per batch


def kwargs(pipe: Any, negatives: list[str], cfg: bool, rows: int) -> dict[str, Any] | None:
    """The ``cross_attention_kwargs`` of a batch of ``rows`` images: the first ``rows`` of the
    UNet's ``2 * rows`` (diffusers puts the negatives first) are zero where every negative is
    empty and the model zeroes empty prompts; otherwise None (the pipeline's default)."""
    unet = getattr(pipe, "unet", None)
    if not cfg or any(negatives) or unet is None or not getattr(pipe.config, "force_zeros_for_empty_prompt", False):
        return None
    if not getattr(unet, "_diffq_empty_negative", False):
        return None
    return {ZERO_ROWS: rows}


def for_rows(cross_attention_kwargs: dict[str, Any] | None, start: int, rows: int) -> dict[str, Any] | None:
    """The same kwargs for the rows ``start .. start + rows`` of the batch (a CFG pair's rank runs
    one half): the zero rows among them, which lead them as they lead the batch."""
    if not cross_attention_kwargs or not cross_attention_kwargs.get(ZERO_ROWS):
        return cross_attention_kwargs
    zero = min(max(cross_attention_kwargs[ZERO_ROWS] - start, 0), rows)
    return {**cross_attention_kwargs, ZERO_ROWS: zero}
