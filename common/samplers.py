"""The samplers a job can ask for (``sampler`` column, ``--sampler``), by the names ComfyUI,
SwarmUI and InvokeAI users know, each a diffusers scheduler and its config.

Data only: the producer checks names without importing diffusers; the worker builds the
scheduler (``worker/pipelines/samplers.py``) from the model's own scheduler config and these
overrides, outside the compiled graph, so a worker switches samplers between jobs without a
reload or a recompile. An empty ``sampler`` is the model's own scheduler (SDXL base: Euler,
FLUX: flow-matching Euler); ``timestep_spacing`` sets the scheduler's spacing where it matters
(few-step recipes want ``trailing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.errors import InvalidJobSpec


@dataclass(frozen=True)
class Sampler:
    """A diffusers scheduler class and the config it takes over the model's own."""

    scheduler: str
    config: dict[str, object] = field(default_factory=dict)
    #: runs flow-matching models (FLUX) too; the others predict noise (SDXL, SD1.5)
    flow: bool = False


SAMPLERS: dict[str, Sampler] = {
    "euler": Sampler("EulerDiscreteScheduler", flow=True),
    "euler-a": Sampler("EulerAncestralDiscreteScheduler"),
    "dpm++2m": Sampler("DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpm++2m-karras": Sampler(
        "DPMSolverMultistepScheduler", {"algorithm_type": "dpmsolver++", "solver_order": 2, "use_karras_sigmas": True}
    ),
    "dpm++2m-sde-karras": Sampler(
        "DPMSolverMultistepScheduler",
        {"algorithm_type": "sde-dpmsolver++", "solver_order": 2, "use_karras_sigmas": True},
    ),
    "unipc": Sampler("UniPCMultistepScheduler"),
    "ddim": Sampler("DDIMScheduler"),
    "heun": Sampler("HeunDiscreteScheduler"),
    "lcm": Sampler("LCMScheduler"),
    "tcd": Sampler("TCDScheduler"),
}
#: diffusers' ``timestep_spacing`` values
SPACINGS = ("leading", "linspace", "trailing")


def check_sampler(name: str, value: object) -> None:
    """None (the model's own) or a known name: else one line with the list (the reader adds
    ``FILE:LINE``)."""
    if value is not None and value not in SAMPLERS:
        raise InvalidJobSpec(f"unknown {name} {value!r}; use one of {', '.join(SAMPLERS)} (empty: the model's own)")


def check_spacing(name: str, value: object) -> None:
    if value is not None and value not in SPACINGS:
        raise InvalidJobSpec(f"unknown {name} {value!r}; use one of {', '.join(SPACINGS)} (empty: the sampler's own)")
