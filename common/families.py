"""Which diffusers pipelines diffq runs, as plain data the producer reads without torch.

A local model folder names its pipeline in ``model_index.json`` (``_class_name``); the producer
refuses at enqueue, with the row or flag, a folder whose pipeline no family runs, rather than a
worker downloading it and giving it back. The worker's families
(:mod:`worker.pipelines.families`) run SDXL, FLUX, SD3 and PixArt with their levers, and any
other text-to-image pipeline below eagerly. The list is diffusers' own
``AUTO_TEXT2IMAGE_PIPELINES_MAPPING`` less the pipelines that need an image beside the prompt
(ControlNet, Control, Kontext, inpainting); tests/test_families.py checks it against the
installed diffusers.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the families with a module of their own (their levers, splits and presets), by title
NAMED_FAMILIES = ("SDXL", "FLUX", "SD3", "PixArt")

#: what a pipeline's name holds when it needs an image beside the prompt
NEEDS_AN_IMAGE = ("ControlNet", "Control", "Kontext", "Inpaint")

TEXT_TO_IMAGE: frozenset[str] = frozenset(
    {
        "AuraFlowPipeline", "ChromaPipeline", "CogView3PlusPipeline", "CogView4Pipeline", "Flux2KleinPipeline",
        "Flux2Pipeline", "FluxPipeline", "GlmImagePipeline", "HeliosPipeline", "HeliosPyramidPipeline",
        "HunyuanDiTPAGPipeline", "HunyuanDiTPipeline", "IFPipeline", "Ideogram4Pipeline", "Kandinsky3Pipeline",
        "KandinskyCombinedPipeline", "KandinskyV22CombinedPipeline", "Krea2Pipeline",
        "LatentConsistencyModelPipeline", "Lumina2Pipeline", "LuminaPipeline", "NucleusMoEImagePipeline",
        "OvisImagePipeline", "PRXPipeline", "PixArtAlphaPipeline", "PixArtSigmaPAGPipeline", "PixArtSigmaPipeline",
        "QwenImage21Pipeline", "QwenImagePipeline", "SanaPAGPipeline", "SanaPipeline",
        "StableCascadeCombinedPipeline", "StableDiffusion3PAGPipeline", "StableDiffusion3Pipeline",
        "StableDiffusionPAGPipeline", "StableDiffusionPipeline", "StableDiffusionXLPAGPipeline",
        "StableDiffusionXLPipeline", "WuerstchenCombinedPipeline", "ZImageOmniPipeline", "ZImagePipeline",
    }
)  # fmt: skip


def runs_here(class_name: str) -> bool:
    return class_name in TEXT_TO_IMAGE


def folder_pipeline(folder: Path) -> str | None:
    """The pipeline class a diffusers folder names (``model_index.json``'s ``_class_name``);
    None where the folder has no readable index (a single-file checkpoint, a half-copied folder:
    the worker's load says what is wrong with it)."""
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    name = index.get("_class_name") if isinstance(index, dict) else None
    return name if isinstance(name, str) else None


def refusal(class_name: str) -> str:
    """Why a pipeline does not run here, in one line with what does."""
    why = "needs an image beside the prompt" if any(w in class_name for w in NEEDS_AN_IMAGE) else "is not text-to-image"
    return (
        f"is a {class_name}, which {why}; diffq runs text-to-image pipelines: "
        f"{', '.join(NAMED_FAMILIES)} with their speed levers, and any other of diffusers' "
        "AutoPipelineForText2Image pipelines eagerly (docs/usage.md, Models)"
    )
