"""``fuse-qkv``: an attention's query, key and value projections as one product, kept equal to
their parts.

diffusers fuses by copying: ``fuse_projections`` builds ``to_qkv`` (``to_kv`` for a
cross-attention, ``to_added_qkv`` for FLUX's text stream) from the weights of ``to_q``,
``to_k`` and ``to_v``, keeps the parts, and from then on the attention reads the fused layer
alone. Adapters merge into the parts (their names are what LoRA and DoRA files target), so
after every switch :func:`refresh` copies the parts into the fused layers again, in place: a
compiled graph or a CUDA graph reads the same memory with the new values.

Why a DiT may take it: a ring rank of 2 holds half an image's rows, and three products of half
the rows leave SMs idle where one three times as wide does not (FLUX's text stream at 256 rows
costs what it does at 512). Measured on one H200, a rank's blocks were 1-2 % faster with it and
one GPU's image no faster; on a ring of 2 (2 H200s) a FLUX image took 2.191 -> 2.152 s
(docs/groups.md). So it is opt-in, and in a ring group's defaults (worker/group/engine.py). The
parts stay for the adapters: 4 GiB more for FLUX.1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

#: fused layer -> its parts, as diffusers' ``fuse_projections`` names them
FUSED = {
    "to_qkv": ("to_q", "to_k", "to_v"),
    "to_kv": ("to_k", "to_v"),
    "to_added_qkv": ("add_q_proj", "add_k_proj", "add_v_proj"),
}
COMPONENTS = ("unet", "transformer")


def pairs(pipe: Any) -> Iterator[tuple[torch.nn.Module, list[torch.nn.Module]]]:
    """Each fused layer in ``pipe``'s denoiser with its parts."""
    for component in COMPONENTS:
        model = getattr(pipe, component, None)
        if not isinstance(model, torch.nn.Module):
            continue
        for attention in model.modules():
            if not getattr(attention, "fused_projections", False):
                continue
            for fused_name, part_names in FUSED.items():
                fused = getattr(attention, fused_name, None)
                parts = [getattr(attention, name, None) for name in part_names]
                if fused is not None and all(part is not None for part in parts):
                    yield fused, parts  # type: ignore[misc]


@torch.no_grad()
def refresh(pipe: Any, changed: Iterable[torch.nn.Module] | None = None) -> list[torch.nn.Module]:
    """Copy the parts' weights (and biases) into their fused layers; returns the fused layers
    written. ``changed``: the layers an adapter has ever touched (only fused layers with such a
    part are written); None for all."""
    wanted = None if changed is None else {id(m) for m in changed}
    written = []
    for fused, parts in pairs(pipe):
        if wanted is not None and not any(id(part) in wanted for part in parts):
            continue
        fused.weight.copy_(torch.cat([part.weight for part in parts]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([part.bias for part in parts]))
        written.append(fused)
    return written
