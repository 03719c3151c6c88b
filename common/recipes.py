"""Few-step recipes: the settings a distilled model or adapter was trained for, by name
(``--recipe sdxl-lightning-4`` or a ``recipe`` column).

A distilled model run with a base model's settings makes wrong images and says nothing: an
SDXL-Lightning adapter at 30 steps with CFG 5 and a leading-spaced Euler is not the image its
authors show. A recipe sets the steps, guidance, sampler, spacing and size together; a row's
own cells and the producer's flags still win (``producer/reader.py``). The producer also
recognises the known adapters and models by name (:data:`Recipe.marks`) and says, once per
file, when a row contradicts their recipe.

Licences are the authors' (their model cards, 2026-12-01); several are not for commercial use.
diffq ships none of these weights: a recipe is only settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidJobSpec


@dataclass(frozen=True)
class Recipe:
    steps: int
    guidance: float
    sampler: str | None
    timestep_spacing: str | None
    width: int
    height: int
    #: what it is and where its weights are
    what: str
    licence: str
    #: lower-case parts of an adapter file or model id that name this recipe's weights
    marks: tuple[str, ...] = ()

    def settings(self) -> dict[str, object]:
        """The generation parameters it sets (``common/jobspec.py:GenParams`` names)."""
        return {
            "steps": self.steps,
            "guidance": self.guidance,
            "sampler": self.sampler,
            "timestep_spacing": self.timestep_spacing,
            "width": self.width,
            "height": self.height,
        }

    def describe(self) -> str:
        spacing = f" {self.timestep_spacing}" if self.timestep_spacing else ""
        return (
            f"{self.steps} steps, guidance {self.guidance:g}, {self.sampler or 'its own sampler'}{spacing}, "
            f"{self.width}x{self.height}"
        )


def _lightning(steps: int) -> Recipe:
    return Recipe(
        steps, 0.0, "euler", "trailing", 1024, 1024,
        f"SDXL-Lightning {steps}-step (ByteDance/SDXL-Lightning: the UNet or the LoRA)", "openrail++",
        (f"lightning_{steps}step", f"lightning-{steps}step"),
    )  # fmt: skip


RECIPES: dict[str, Recipe] = {
    "sdxl-lightning-2": _lightning(2),
    "sdxl-lightning-4": _lightning(4),
    "sdxl-lightning-8": _lightning(8),
    "hyper-sdxl-8": Recipe(
        8,
        0.0,
        "ddim",
        "trailing",
        1024,
        1024,
        "Hyper-SDXL 8-step LoRA (ByteDance/Hyper-SD)",
        "see its model card (not verified here)",
        ("hyper-sdxl-8steps",),
    ),
    "dmd2-4": Recipe(
        4,
        0.0,
        "lcm",
        None,
        1024,
        1024,
        "DMD2 4-step (tianweiy/DMD2: the UNet or the LoRA)",
        "cc-by-nc-4.0 (not commercial)",
        ("dmd2_sdxl_4step",),
    ),
    "lcm-lora-sdxl": Recipe(
        4,
        1.0,
        "lcm",
        None,
        1024,
        1024,
        "LCM-LoRA for SDXL (latent-consistency/lcm-lora-sdxl)",
        "openrail++",
        ("lcm-lora-sdxl", "lcm_lora_sdxl"),
    ),
    "tcd-sdxl": Recipe(
        4,
        0.0,
        "tcd",
        None,
        1024,
        1024,
        "TCD LoRA for SDXL (h1t/TCD-SDXL-LoRA)",
        "see its model card (not verified here)",
        ("tcd-sdxl", "tcd_sdxl"),
    ),
    "sdxl-turbo": Recipe(
        1,
        0.0,
        "euler-a",
        "trailing",
        512,
        512,
        "SDXL-Turbo (stabilityai/sdxl-turbo)",
        "Stability AI non-commercial research community licence (not commercial)",
        ("sdxl-turbo",),
    ),
    "flux-schnell": Recipe(
        4,
        0.0,
        None,
        None,
        1024,
        1024,
        "FLUX.1-schnell (black-forest-labs/FLUX.1-schnell)",
        "apache-2.0",
        ("flux.1-schnell", "flux-schnell"),
    ),
}


def recipe(name: str) -> Recipe:
    """The recipe called ``name``, or one line with the list."""
    found = RECIPES.get(name)
    if found is None:
        raise InvalidJobSpec(f"unknown recipe {name!r}; use one of {', '.join(RECIPES)}")
    return found


def recognised(*names: str | None) -> tuple[str, Recipe] | None:
    """The recipe whose weights an adapter path or model id names, if any."""
    text = " ".join(n.lower() for n in names if n)
    for name, found in RECIPES.items():
        if any(mark in text for mark in found.marks):
            return name, found
    return None


def contradictions(found: Recipe, params: dict[str, object]) -> list[str]:
    """What of ``params`` differs from ``found``'s settings, as ``steps 30 (its recipe: 4)``;
    size and an unset sampler are left alone (a recipe's size is a default, not a must)."""
    said = []
    for name in ("steps", "guidance", "sampler", "timestep_spacing"):
        want, got = found.settings()[name], params.get(name)
        if want is not None and got != want:
            said.append(f"{name} {got} (its recipe: {want})")
    return said
