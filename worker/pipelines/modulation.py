"""``modulation-once``: a FLUX image's modulation vectors for all its steps at its first step.

Every FLUX block scales, shifts and gates its activations by vectors that depend on the step's
time embedding only (``linear(silu(temb))`` in each block's norms, 19 + 19 + 38 + 1 of them,
3072 → 6 × 3072 at most). At one image a step those are products of one row against 6.4 GB of
weights, read again at every step: cuBLAS's one-row kernels took 0.06 s of a 1024² image on an
H200 (``fluxwhere``, docs/groups.md), on one GPU and on every rank of a group alike. An
image's time embeddings are known before its first step (its schedule's timesteps, its
guidance and its pooled prompt), so this computes every step's vectors then, one product of
``steps × batch`` rows per layer, reading each weight once an image, and each step's layers read
their row.

How: the layers become :class:`TabledLinear` (still an ``nn.Linear``, so an adapter's LoRA wraps
it as before and adds its own part at every step), and a forward pre-hook on the transformer,
which runs on every call even when the call is a CUDA graph's replay, copies the step's row
into the tensors the layers return. The step is the scheduler's own count (FLUX's pipeline
sets it to 0 before an image and the scheduler adds one a step); a new image is a call before
the count has started, or one with another pooled prompt, guidance or schedule. A call the
table cannot serve (no schedule, a step past it) computes the layers as before.

Memory: FLUX.1's table holds 1,056,768 values a step and an image, 2.1 MB in bf16 (59 MB for an
image of 28 steps; measured peak +0.06 GiB on an H200). The lever needs the weights where the
hook runs, so it is not combined with an offload (:data:`worker.pipelines.offload.NOT_WITH_OFFLOAD`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("diffq.worker")


class TabledLinear(torch.nn.Linear):
    """A linear whose output for this call may be given beforehand (``tabled``): the step's row
    of the table, a view of memory that stays put (a CUDA graph reads it). None: computed."""

    tabled: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tabled is None:
            return super().forward(x)
        return self.tabled


def _modulating_linears(transformer: torch.nn.Module) -> list[torch.nn.Linear]:
    """The ``linear`` of every norm whose input is the step's time embedding alone."""
    from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle

    found = []
    for module in transformer.modules():
        if isinstance(module, AdaLayerNormZero) and module.emb is not None:
            continue  # its embedding comes from class labels too
        norm = isinstance(module, (AdaLayerNormZero, AdaLayerNormZeroSingle, AdaLayerNormContinuous))
        if norm and type(module.linear) in (torch.nn.Linear, TabledLinear):  # not one an adapter wraps
            found.append(module.linear)
    return found


class StepModulation:
    """The table of one image's modulations and the hook that serves it."""

    def __init__(self, pipe: Any) -> None:
        self.transformer = pipe.transformer
        self.scheduler = pipe.scheduler
        self.linears = _modulating_linears(self.transformer)
        for linear in self.linears:
            linear.__class__ = TabledLinear
            linear.tabled = None
        widths = [linear.out_features for linear in self.linears]
        self.offsets = [sum(widths[:i]) for i in range(len(widths) + 1)]
        self.rows: dict[int, torch.Tensor] = {}  # batch → [batch, all widths]: what the layers read
        self.table: torch.Tensor | None = None  # [steps, batch, all widths]
        self.made_for: tuple[Any, ...] = ()
        self.builds = 0
        self.handle = self.transformer.register_forward_pre_hook(self._before, with_kwargs=True)

    def remove(self) -> None:
        """The layers compute again, as plain linears (xDiT's wrappers run their own loop)."""
        self.handle.remove()
        for linear in self.linears:
            linear.tabled = None
            linear.__class__ = torch.nn.Linear
            del linear.tabled
        self.rows.clear()
        self.table = None

    def _serve(self, rows: torch.Tensor | None) -> None:
        for i, linear in enumerate(self.linears):
            linear.tabled = None if rows is None else rows[:, self.offsets[i] : self.offsets[i + 1]]

    def _before(self, _module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        timestep, pooled = kwargs.get("timestep"), kwargs.get("pooled_projections")
        guidance = kwargs.get("guidance")
        timesteps = getattr(self.scheduler, "timesteps", None)
        if hidden is None or timestep is None or pooled is None or timesteps is None:
            self._serve(None)
            return
        step = self.scheduler.step_index
        if step is None:
            step = self.scheduler.begin_index or 0
        batch = hidden.shape[0]
        made_for = (timesteps, pooled, guidance, batch, hidden.dtype)
        if step == (self.scheduler.begin_index or 0) or not self._same(made_for):
            self._build(hidden, pooled, guidance, timesteps)
            self.made_for = made_for
        assert self.table is not None
        if step >= self.table.shape[0]:
            self._serve(None)
            return
        rows = self.rows.get(batch)
        if rows is None or rows.dtype != self.table.dtype:
            rows = self.rows[batch] = torch.empty_like(self.table[0])
        rows.copy_(self.table[step])
        self._serve(rows)

    def _same(self, made_for: tuple[Any, ...]) -> bool:
        """The same schedule, prompts and guidance (the same tensors: one pipeline call passes
        the same ones every step), batch and dtype as the table's."""
        if len(made_for) != len(self.made_for):
            return False
        return all(
            a is b if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else a == b
            for a, b in zip(made_for, self.made_for, strict=True)
        )

    @torch.no_grad()
    def _build(
        self, hidden: torch.Tensor, pooled: torch.Tensor, guidance: torch.Tensor | None, timesteps: torch.Tensor
    ) -> None:
        """Every step's time embedding as the transformer computes it (FLUX's pipeline passes
        ``t.to(dtype) / 1000``, the transformer multiplies by 1000 in its dtype), then each layer
        over all of them at once."""
        dtype, batch = hidden.dtype, hidden.shape[0]
        steps = timesteps.to(device=hidden.device).to(dtype) / 1000
        steps = steps.to(dtype) * 1000
        per_row = steps.repeat_interleave(batch)
        pooled_rows = pooled.repeat(len(steps), 1)
        embed = self.transformer.time_text_embed
        if guidance is None:
            temb = embed(per_row, pooled_rows)
        else:
            temb = embed(per_row, (guidance.to(dtype) * 1000).repeat(len(steps)), pooled_rows)
        act = torch.nn.functional.silu(temb).to(dtype)
        self.table = torch.cat([torch.nn.Linear.forward(linear, act) for linear in self.linears], dim=1)
        self.table = self.table.view(len(steps), batch, -1)
        self.builds += 1


def install(pipe: Any) -> StepModulation | None:
    """Table ``pipe``'s modulations (a FLUX pipeline's; anything else: None, nothing changes)."""
    transformer = getattr(pipe, "transformer", None)
    scheduler = getattr(pipe, "scheduler", None)
    if transformer is None or not hasattr(transformer, "time_text_embed") or not hasattr(scheduler, "step_index"):
        return None
    if isinstance(getattr(transformer, "diffq_modulation", None), StepModulation):
        return transformer.diffq_modulation
    if not _modulating_linears(transformer):
        return None
    tabled = StepModulation(pipe)
    transformer.diffq_modulation = tabled
    return tabled


def remove(pipe: Any) -> bool:
    """Undo :func:`install`; returns whether there was a table."""
    transformer = getattr(pipe, "transformer", None)
    tabled = getattr(transformer, "diffq_modulation", None)
    if not isinstance(tabled, StepModulation):
        return False
    tabled.remove()
    del transformer.diffq_modulation
    return True
