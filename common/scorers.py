"""Reward scores a job asks its worker for (``--score clip,aesthetic``), as data the producer checks.

Each score names a scorer and, after ``=``, its model (a hub id, a folder, or a preset), as
``--model`` does; without one, the scorer's usual model. Scores do not change an image's pixels,
so they are not in an item's key: an image already made is not made again to be scored.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidJobSpec


@dataclass(frozen=True)
class Scorer:
    #: what the score is, in a sentence (the docs' table, the flag's help)
    what: str
    #: the model a bare name loads
    model: str


SCORERS: dict[str, Scorer] = {
    "clip": Scorer("100 × the cosine of CLIP's image and prompt embeddings, 0 at worst (torchmetrics' CLIPScore)",
                   "openai/clip-vit-large-patch14"),
    "pickscore": Scorer("the CLIP model's logit scale × that cosine (PickScore's reward; its model is CLIP-H)",
                        "yuvalkirstain/PickScore_v1"),
    "aesthetic": Scorer("a linear head over CLIP's normalised image embedding (aesthetic_head.safetensors in "
                        "the model's folder)", "tiny-clip"),
}  # fmt: skip

#: scorer models written locally (tests, the demo): random weights, the real code path
SCORER_PRESETS = {
    "tiny-clip": "a small CLIP with random weights and an aesthetic head, written to the cache",
    "clip-l-random": "CLIP ViT-L/14's architecture (clip's model) with random weights, built on the device",
    "clip-h-random": "CLIP ViT-H/14's architecture (PickScore's model) with random weights, built on the device",
}
MAX_SCORES = 4


def parse(text: str) -> tuple[str, ...]:
    """``clip,aesthetic=./head`` as each score's canonical ``name=model``; :class:`InvalidJobSpec`
    with the list of scorers for a name diffq has none for."""
    specs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, model = part.partition("=")
        name, model = name.strip(), model.strip()
        if name not in SCORERS:
            raise InvalidJobSpec(f"unknown scorer {name!r}; scorers: {', '.join(SCORERS)}")
        specs.append(f"{name}={model or SCORERS[name].model}")
    names = [spec.partition("=")[0] for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidJobSpec(f"--score {text!r} names a scorer twice")
    if len(specs) > MAX_SCORES:
        raise InvalidJobSpec(f"--score {text!r}: at most {MAX_SCORES} scorers a job")
    return tuple(specs)


def check_scorer_model(model: str) -> None:
    """What the producer can know of a scorer's model: a preset, a folder here, or a hub id."""
    from pathlib import Path

    if model in SCORER_PRESETS or Path(model).expanduser().is_dir():
        return
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise InvalidJobSpec(
            f"scorer model {model!r} is neither a preset ({', '.join(SCORER_PRESETS)}), a folder here, nor a hub id"
        )


def check(specs: object) -> None:
    """A job payload's ``scores``: canonical specs :func:`parse` would give back."""
    if not isinstance(specs, list | tuple) or not all(isinstance(s, str) and "=" in s for s in specs):
        raise InvalidJobSpec("scores must be a list of name=model")
    if tuple(specs) != parse(",".join(specs)):
        raise InvalidJobSpec(f"scores {list(specs)!r} are not what --score writes")
