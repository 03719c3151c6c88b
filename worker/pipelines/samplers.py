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
