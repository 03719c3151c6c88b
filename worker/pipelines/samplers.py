"""A job's sampler on a warm pipeline: the scheduler swapped between jobs, outside the compiled
graph (the UNet's and decoder's graphs never read it), so no reload and no recompile.

Each scheduler is built once per pipeline from the model's own scheduler config and the
sampler's overrides (``common/samplers.py``), and kept; an empty sampler puts the model's own
back. A scheduler holds per-call state (its timesteps, a multistep solver's last outputs), but
every pipeline call sets its timesteps first, which resets it.
"""

from __future__ import annotations

from typing import Any

import diffusers
import torch

from common.errors import InvalidJobSpec
from common.samplers import SAMPLERS

#: the model's own scheduler, kept on the pipeline the first time another is put in its place
_OWN = "_diffq_own_scheduler"
_BUILT = "_diffq_schedulers"


def use(pipe: Any, sampler: str | None, spacing: str | None) -> str:
    """Give ``pipe`` the scheduler of ``sampler`` with ``spacing``; returns the scheduler's class
    name. Raises :class:`InvalidJobSpec` for a sampler the model cannot run (a noise-prediction
    sampler on a flow-matching model such as FLUX)."""
    own = pipe.__dict__.setdefault(_OWN, pipe.scheduler)
    if sampler is None and spacing is None:
        pipe.scheduler = own
        return type(own).__name__
    flow = "FlowMatch" in type(own).__name__
    built: dict[tuple[str | None, str | None], Any] = pipe.__dict__.setdefault(_BUILT, {})
    key = (sampler, spacing)
    if key not in built:
        overrides: dict[str, object] = {} if spacing is None else {"timestep_spacing": spacing}
        if flow:
            if sampler not in (None, "euler"):
                raise InvalidJobSpec(
                    f"sampler {sampler!r} predicts noise; {type(pipe).__name__} is a flow-matching model that "
                    "runs its own flow-matching Euler: leave the sampler empty (or euler)"
                )
            cls = type(own)  # FLUX's euler is its own flow-matching Euler
        else:
            chosen = SAMPLERS[sampler] if sampler is not None else None
            cls = getattr(diffusers, chosen.scheduler) if chosen is not None else type(own)
            overrides = {**(chosen.config if chosen is not None else {}), **overrides}
        built[key] = cls.from_config(own.config, **overrides)
    pipe.scheduler = built[key]
    return type(built[key]).__name__


def one_timestep_dtype(denoiser: torch.nn.Module) -> None:
    """Give ``denoiser`` its timestep as float32 whatever the sampler made it.

    Samplers hand the UNet its timestep as float32 (Euler, Euler-a, Heun) or int64 (DPM-Solver,
    UniPC, DDIM, LCM, TCD), and a compiled UNet is specialised on its inputs' dtypes: a worker
    that switched between the two kinds compiled a second graph (140 s on an H200,
    docs/benchmarks.md). The UNet's time projection casts the timestep to float32 first thing
    (``get_timestep_embedding``), exact for every integer timestep, so the cast here changes no
    pixel; it runs in the module's call, before the precompiled forward sees its inputs."""

    def hook(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].dtype != torch.float32:
            args = (args[0], args[1].float(), *args[2:])
        step = kwargs.get("timestep")
        if isinstance(step, torch.Tensor) and step.dtype != torch.float32:
            kwargs = {**kwargs, "timestep": step.float()}
        return args, kwargs

    denoiser.register_forward_pre_hook(hook, with_kwargs=True)
