"""The job spec: what one queued job asks a worker to generate.

A job is a *chunk*: several prompts that share model, adapter, size, steps and guidance, so
the worker can run them as one GPU batch. Each prompt keeps its own seed and output name.

The spec travels as plain JSON (RQ's ``JSONSerializer``), never pickle, and is validated
twice: by the producer before anything is enqueued, and by the worker before anything runs,
because whoever can write to Redis is not necessarily who we trust.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from common.errors import InvalidJobSpec

SPEC_VERSION = 1

MIN_SIDE = 64
MAX_SIDE = 4096
MAX_STEPS = 500
MAX_GUIDANCE = 50.0
MAX_NUM_IMAGES = 16
MAX_PROMPT_CHARS = 4000
MAX_ID_CHARS = 200
MAX_SEED = 2**63 - 1
MAX_ADAPTER_SCALE = 10.0
MAX_NAME_CHARS = 1000


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidJobSpec(message)


def _check_text(name: str, value: Any, *, max_chars: int, allow_empty: bool) -> None:
    # the common case in one expression: this runs for every row of a 10^7-row file
    if type(value) is str and len(value) <= max_chars and "\x00" not in value and (allow_empty or value.strip()):
        return
    _require(isinstance(value, str), f"{name} must be text")
    _require(allow_empty or value.strip() != "", f"{name} is empty")
    _require(len(value) <= max_chars, f"{name} is {len(value)} characters long (at most {max_chars})")
    _require("\x00" not in value, f"{name} contains a NUL byte")


def _check_int(name: str, value: Any, lo: int, hi: int) -> None:
    if type(value) is int and lo <= value <= hi:
        return
    _require(isinstance(value, int) and not isinstance(value, bool), f"{name} must be a whole number")
    _require(lo <= value <= hi, f"{name} {value} is outside {lo}..{hi}")


def _check_float(name: str, value: Any, lo: float, hi: float) -> None:
    ok_type = isinstance(value, int | float) and not isinstance(value, bool)
    _require(ok_type, f"{name} must be a number")
    _require(math.isfinite(value), f"{name} must be a finite number, not {value}")
    _require(lo <= value <= hi, f"{name} {value} is outside {lo:g}..{hi:g}")


#: The :class:`GenParams` fields every item key has held since the first version. A field added
#: later is not listed here: ``common/naming.py:item_key`` writes it into a key only when it is
#: set to something other than its default, so an item made before the field existed keeps its
#: key and a resumed campaign redoes nothing (tests/test_naming.py shows it with a new field).
KEY_FIELDS_V1 = frozenset({"model", "width", "height", "steps", "guidance", "adapter", "adapter_scale"})


@dataclass(frozen=True, kw_only=True)
class GenParams:
    """Settings every prompt of one chunk shares; chunks are formed by grouping on these."""

    model: str
    width: int = 1024
    height: int = 1024
    steps: int = 30
    guidance: float = 5.0
    adapter: str | None = None
    adapter_scale: float = 1.0

    def validate(self) -> GenParams:
        _check_text("model", self.model, max_chars=MAX_NAME_CHARS, allow_empty=False)
        for side in ("width", "height"):
            value = getattr(self, side)
            _check_int(side, value, MIN_SIDE, MAX_SIDE)
            _require(value % 8 == 0, f"{side} {value} is not a multiple of 8")
        _check_int("steps", self.steps, 1, MAX_STEPS)
        _check_float("guidance", self.guidance, 0.0, MAX_GUIDANCE)
        if self.adapter is not None:
            _check_text("adapter", self.adapter, max_chars=MAX_NAME_CHARS, allow_empty=False)
        _check_float("adapter_scale", self.adapter_scale, -MAX_ADAPTER_SCALE, MAX_ADAPTER_SCALE)
        return self

    def short(self) -> str:
        adapter = f" · {self.adapter}@{self.adapter_scale:g}" if self.adapter else ""
        return f"{self.width}x{self.height} · {self.steps} steps · cfg {self.guidance:g} · {self.model}{adapter}"


@dataclass(frozen=True, kw_only=True)
class PromptItem:
    """One row of the prompts file: a prompt, its seed and how many images to make from it.

    Image ``i`` of the item uses seed ``seed + i``, so every image is reproducible alone.
    """

    prompt: str
    seed: int
    negative_prompt: str = ""
    num_images: int = 1
    id: str | None = None

    def validate(self) -> PromptItem:
        _check_text("prompt", self.prompt, max_chars=MAX_PROMPT_CHARS, allow_empty=False)
        _check_text("negative_prompt", self.negative_prompt, max_chars=MAX_PROMPT_CHARS, allow_empty=True)
        _check_int("seed", self.seed, 0, MAX_SEED)
        _check_int("num_images", self.num_images, 1, MAX_NUM_IMAGES)
        if self.id is not None:
            _check_text("id", self.id, max_chars=MAX_ID_CHARS, allow_empty=False)
        return self


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A chunk of prompts plus where their images go; the payload of one RQ job."""

    params: GenParams
    output: str
    items: tuple[PromptItem, ...] = field(default_factory=tuple)

    @property
    def num_images(self) -> int:
        return sum(item.num_images for item in self.items)

    def validate(self) -> JobSpec:
        self.params.validate()
        _check_text("output", self.output, max_chars=MAX_NAME_CHARS, allow_empty=False)
        _require(len(self.items) > 0, "a job needs at least one prompt")
        for item in self.items:
            item.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": SPEC_VERSION,
            "params": dict(self.params.__dict__),
            "output": self.output,
            "items": [dict(item.__dict__) for item in self.items],
        }

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Build and validate a spec from untrusted JSON; unknown or missing fields are errors."""
        _require(isinstance(data, dict), "job payload must be a JSON object")
        _require(data.get("v") == SPEC_VERSION, f"job payload version {data.get('v')!r} is not {SPEC_VERSION}")
        _require(set(data) == {"v", "params", "output", "items"}, f"job payload has fields {sorted(data)}")
        params = _build(GenParams, data["params"], "params")
        raw_items = data["items"]
        _require(isinstance(raw_items, list), "items must be a list")
        items = tuple(_build(PromptItem, raw, "item") for raw in raw_items)
        return cls(params=params, output=data["output"], items=items).validate()

    def describe(self, width: int = 60) -> str:
        """A one-line summary for logs and rq-dashboard: the first prompt, shortened, and settings."""
        first = " ".join(self.items[0].prompt.split())
        if len(first) > width:
            first = first[: width - 1] + "…"
        more = f" (+{len(self.items) - 1} more)" if len(self.items) > 1 else ""
        return f"{first!r}{more} · {self.num_images} img · {self.params.short()}"


def _build(cls: type, raw: Any, what: str) -> Any:
    _require(isinstance(raw, dict), f"{what} must be a JSON object")
    names = set(cls.__dataclass_fields__)
    unknown = set(raw) - names
    _require(not unknown, f"{what} has unknown fields {sorted(unknown)}")
    try:
        return cls(**raw)
    except TypeError as exc:
        raise InvalidJobSpec(f"{what} is incomplete: {exc}") from None
