"""Adapters merged into the base weights for as long as jobs ask for the same one.

Why merged rather than PEFT's usual "base layer plus adapter branch" on every forward:

- **Compiled blocks cannot trace the branch.** ``compile-blocks`` compiles the UNet's transformer
  blocks with ``fullgraph=True``; PEFT's DoRA branch calls ``str.startswith`` on a class name,
  which Dynamo refuses (``torch._dynamo.exc.Unsupported``), so a DoRA job failed on a compiled
  worker. A merged layer runs only its base layer: the same graph as no adapter at all.
- **No recompiles, ever.** Between switches PEFT's wrapper layers are taken out of the model
  and their base layers put back where they were (:meth:`MergedAdapters.unwrap`): the compiled
  UNet sees the very modules it was compiled with, holding other weight *values*. With the
  wrappers left in, each adapter state (the first LoRA merged, the first DoRA, adapters
  switched off) was a new graph to trace: three mid-campaign compiles of about 20 s each for a
  whole-UNet compile on an H200 (2026-11-23).
- **No per-step cost.** An unmerged adapter adds two small matmuls per adapted layer per step;
  merged, an adapter job runs as fast as a plain one. A switch costs one weight copy and one
  merge per adapted layer, once per change of adapter (not per job).

Merging and unmerging in fp16 drifts, so the weights are never "unmerged": the first time a
layer is wrapped by an adapter its base weight is copied aside (pristine), and every switch
copies the pristine weight back before merging the next adapter. The copies cost as much
memory as the adapted layers (for an SDXL LoRA on the attention projections, about 1 GB in fp16).

Most adapters never meet PEFT at all: a plain LoRA or DoRA on the UNet's linear layers is read
as tensors and merged by :mod:`worker.pipelines.adapter_weights` (building PEFT's wrappers was
most of an adapter's first job). PEFT loads the rest, and both kinds switch through here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from peft.tuners.tuners_utils import BaseTunerLayer

from worker.pipelines.adapter_weights import AdapterWeights

log = logging.getLogger("diffq.worker")

COMPONENTS = ("unet", "transformer", "text_encoder", "text_encoder_2")


class MergedAdapters:
    """Which adapter is merged into ``pipe``'s weights, and the pristine weights to undo it."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        #: the adapters merged now, with their weights, in merge order (None: none)
        self.merged: tuple[tuple[str, float], ...] | None = None
        self.disabled = False  # adapters switched off (a job without one)
        #: adapters read without PEFT (worker/pipelines/adapter_weights.py), by name
        self.direct: dict[str, AdapterWeights] = {}
        #: adapters PEFT loaded (files the direct reader leaves to it)
        self.peft: set[str] = set()
        self._pristine: dict[int, tuple[torch.nn.Module, torch.Tensor]] = {}
        #: PEFT's wrappers taken out of the model: (parent, attribute, wrapper)
        self._unwrapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def layers(self) -> list[BaseTunerLayer]:
        found: list[BaseTunerLayer] = []
        for component in COMPONENTS:
            module = getattr(self.pipe, component, None)
            if isinstance(module, torch.nn.Module):
                found += [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
        return found

    def unwrap(self) -> None:
        """Put each wrapper's base layer back in its place: the model is the one it was before
        any adapter was loaded (its merged weights aside), so compiled graphs stay valid."""
        for component in COMPONENTS:
            module = getattr(self.pipe, component, None)
            if not isinstance(module, torch.nn.Module):
                continue
            for parent in list(module.modules()):
                for attribute, child in list(parent.named_children()):
                    if isinstance(child, BaseTunerLayer):
                        setattr(parent, attribute, child.get_base_layer())
                        self._unwrapped.append((parent, attribute, child))

    def rewrap(self) -> None:
        """PEFT's wrappers back, for PEFT to load, switch or merge adapters."""
        for parent, attribute, wrapper in reversed(self._unwrapped):
            setattr(parent, attribute, wrapper)
        self._unwrapped.clear()

    @torch.no_grad()
    def restore(self) -> None:
        """Pristine base weights back in every adapted layer; nothing merged; PEFT's wrappers in
        place (a newly loaded adapter must find the layers it shares with the others)."""
        self.rewrap()
        for base, weight in self._pristine.values():
            base.weight.copy_(weight)
        for layer in self.layers():
            layer.merged_adapters = []
        self.merged = None

    @torch.no_grad()
    def remember(self, bases: list[torch.nn.Module]) -> None:
        """Copy each base's weight aside the first time an adapter changes it: all of a new
        adapter's layers into one buffer per device and dtype (one allocation, not one per layer)."""
        new = list({id(b): b for b in bases if id(b) not in self._pristine}.values())
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Module]] = {}
        for base in new:
            groups.setdefault((base.weight.device, base.weight.dtype), []).append(base)
        for (device, dtype), members in groups.items():
            buffer = torch.empty(sum(b.weight.numel() for b in members), device=device, dtype=dtype)
            for base, piece in zip(members, buffer.split([b.weight.numel() for b in members]), strict=True):
                copy = piece.view(base.weight.shape)
                copy.copy_(base.weight)
                self._pristine[id(base)] = (base, copy)

    def touched(self) -> list[torch.nn.Module]:
        """Every layer an adapter has changed since the model was loaded: the only ones whose
        weights a switch can change (what the FP8 copies must follow)."""
        return [base for base, _ in self._pristine.values()]

    def remember_new_layers(self) -> None:
        """Copy aside the base weight of every layer a PEFT adapter wraps for the first time. Call
        it after :meth:`restore` and before merging (a newly loaded adapter may wrap new layers)."""
        self.remember([layer.get_base_layer() for layer in self.layers()])

    def current(self, name: str | None, scale: float) -> bool:
        """Whether ``name`` at ``scale`` (or no adapter) is what the pipeline runs with now."""
        return self.current_stack(((name, float(scale)),) if name is not None else ())

    def current_stack(self, stack: tuple[tuple[str, float], ...]) -> bool:
        """Whether these adapters at these weights, in this order (or none), are merged now."""
        wanted = tuple((name, float(weight)) for name, weight in stack) or None
        return wanted == self.merged and (wanted is not None or self.disabled)

    def use(self, name: str | None, scale: float) -> None:
        """Make ``name`` at ``scale`` (or no adapter) the one the pipeline runs with."""
        self.use_stack(((name, float(scale)),) if name is not None else ())

    @torch.no_grad()
    def use_stack(self, stack: tuple[tuple[str, float], ...]) -> None:
        """Make these adapters, merged in this order at their weights (or none), what the
        pipeline runs with. PEFT's adapters first, all at once (``set_adapters`` with their
        weights, then merged), then the directly read ones, each added to the weights the one
        before it left: LoRAs add up whatever the order; a DoRA normalises what it finds."""
        if self.current_stack(stack):
            return
        started = time.perf_counter()
        self.restore()
        self.disabled = not stack
        through_peft = [(name, weight) for name, weight in stack if name in self.peft]
        if through_peft:
            self.remember_new_layers()
            self.pipe.enable_lora()
            names = [name for name, _ in through_peft]
            # scaling = alpha / r * weight, per adapter
            self.pipe.set_adapters(names, adapter_weights=[weight for _, weight in through_peft])
            for layer in self.layers():
                here = [n for n in names if n in getattr(layer, "lora_A", {}) or n in getattr(layer, "lora_B", {})]
                if here:
                    layer.merge(adapter_names=here)
        elif self.peft:
            self.pipe.disable_lora()  # PEFT's adapters add nothing while others are merged
        for name, weight in stack:
            if name in self.direct:
                self.direct[name].merge_into(self.pipe.unet, weight, self.remember)
        self.merged = tuple((name, float(weight)) for name, weight in stack) or None
        self.unwrap()
        log.debug("adapters %s merged in %.3fs", stack or "none", time.perf_counter() - started)
