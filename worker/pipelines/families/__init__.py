"""The model families a worker runs, one module each, behind one registry.

A family says once what the rest of the worker asks of a model: which diffusers pipelines it
is, how one batch runs (prompts encoded once, a CPU generator per image, the job's sampler
already on the pipeline), which speed levers its code applies and what ``--speedups auto``
means for it on CUDA, which splits a group may make of it, and its presets (random weights for
benchmarks, a tiny one written to disk for tests). Nothing else in the worker tests a class
name; diffusers' ``auto_pipeline.py`` mappings and xDiT's ``pipelines/register.py`` are the
model. Adding a family is one module here, listed in :data:`FAMILIES`, plus its presets' rows
in ``common/presets.py``.

The last family, :mod:`.generic`, runs any other text-to-image pipeline of diffusers
(``common/families.py``) eagerly, without levers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.pipelines.pixels import BatchResult

#: ``run(pipe, params, prompts, negatives, seeds, on_step) -> BatchResult``
RunBatch = Callable[..., BatchResult]
#: ``build(device, dtype, cache_dir)``: a pipeline, or a folder to load with ``from_pretrained``
Preset = Callable[..., Any]


@dataclass(frozen=True)
class Family:
    #: the word logs and errors use ("SDXL")
    title: str
    #: the diffusers pipeline classes (and wrappers of them, such as xDiT's) it runs, by name
    pipelines: tuple[str, ...]
    run: RunBatch
    #: the component the levers, FP8 and the memory probe work on
    denoiser: str = "transformer"
    #: the levers its code applies; any other named is left out with one line
    levers: frozenset[str] = frozenset()
    #: what ``--speedups auto`` means for it on CUDA (the CPU runs plain)
    auto: tuple[str, ...] = ()
    #: what it always applies, whatever ``--speedups`` says (FLUX: its modulation vectors once an
    #: image, the same images 1.1 % sooner); an offload still leaves them out
    own: frozenset[str] = frozenset()
    #: the splits a group may make of it (``cfg``, ``data``, ``ulysses``, ``ring``, ``pipefusion``, ``parallel-vae``)
    splits: frozenset[str] = frozenset({"data"})
    #: the denoiser's repeated block classes ``compile-blocks`` compiles, where the model
    #: declares none itself (diffusers' ``_repeated_blocks``: FLUX does, SD3 and PixArt do not)
    blocks: tuple[str, ...] = ()
    #: whether its images take a negative prompt (FLUX.1 is guidance-distilled: none)
    negative_prompt: bool = True
    #: its presets: name -> builder
    presets: dict[str, Preset] = field(default_factory=dict)

    def matches(self, pipe: Any) -> bool:
        return any(cls.__name__ in self.pipelines for cls in type(pipe).__mro__)


def _families() -> tuple[Family, ...]:
    from worker.pipelines.families import flux, generic, pixart, sd3, sdxl

    return (sdxl.FAMILY, flux.FAMILY, sd3.FAMILY, pixart.FAMILY, generic.FAMILY)


FAMILIES: tuple[Family, ...] = _families()


def family_of(pipe: Any) -> Family:
    """The family that runs ``pipe``: the first whose pipelines name its class, else the generic one."""
    return next(family for family in FAMILIES if family.matches(pipe) or family is FAMILIES[-1])


def preset(name: str) -> Preset | None:
    """The builder of preset ``name`` (``tiny``, ``sdxl-random``, ...), None for any other model."""
    return next((family.presets[name] for family in FAMILIES if name in family.presets), None)
