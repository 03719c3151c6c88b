"""The job spec: what one queued job asks a worker to generate.

A job is a *chunk*: several prompts that share model, adapter, size, steps and guidance, so
the worker can run them as one GPU batch. Each prompt keeps its own seed and output name.

The spec travels as plain JSON (RQ's ``JSONSerializer``), never pickle, and is validated
twice: by the producer before anything is enqueued, and by the worker before anything runs,
because whoever can write to Redis is not necessarily who we trust.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from functools import partial
from typing import Any

from common import adapter_stack, image_format, scorers
from common.errors import InvalidJobSpec
from common.presets import check_decoder
from common.samplers import SAMPLERS, SPACINGS, check_sampler, check_spacing

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


def _check_side(name: str, value: Any) -> None:
    _check_int(name, value, MIN_SIDE, MAX_SIDE)
    _require(value % 8 == 0, f"{name} {value} is not a multiple of 8")


@dataclass(frozen=True)
class Param:
    """How one generation parameter is read from a prompts file or a flag, checked, kept in each
    image's metadata and exported. Every :class:`GenParams` field carries one, and every place
    that handles parameters reads them from there (docs/architecture.md, "Adding a generation
    parameter"): the reader's columns and types, the producer's flags and their defaults, the
    checks here, the metadata line and PNG text, ``producer verify``'s rebuild, the shards'
    schema. ``tests/test_jobspec.py`` checks each of them against this list."""

    kind: type  # int, float or str: how a CSV cell or a JSON value is read
    export: str  # the column's Arrow / Hugging Face type in exported shards
    check: Callable[[str, Any], None]
    #: the producer flag's help (``--adapter-scale`` for ``adapter_scale``); None: no flag from here
    flag: str | None = None
    #: meaningful only with an adapter: its default where none is set, absent from metadata
    with_adapter: bool = False


def _param(default: Any, *args: Any, **kwargs: Any) -> Any:
    """A :class:`GenParams` field with its :class:`Param`."""
    return field(default=default, metadata={"param": Param(*args, **kwargs)})


def _check_name(name: str, value: Any) -> None:
    _check_text(name, value, max_chars=MAX_NAME_CHARS, allow_empty=False)


def _check_optional_name(name: str, value: Any) -> None:
    if value is not None:
        _check_name(name, value)


ADAPTER_HELP = "DoRA/LoRA folder or .safetensors file, or the preset tiny-dora, for rows without an adapter cell"


#: The :class:`GenParams` fields every item key has held since the first version. A field added
#: later is not listed here: ``common/naming.py:item_key`` writes it into a key only when it is
#: set to something other than its default, so an item made before the field existed keeps its
#: key and a resumed campaign redoes nothing (tests/test_naming.py shows it with a new field).
KEY_FIELDS_V1 = frozenset({"model", "width", "height", "steps", "guidance", "adapter", "adapter_scale"})


@dataclass(frozen=True, kw_only=True)
class GenParams:
    """Settings every prompt of one chunk shares; chunks are formed by grouping on these. The
    declared list of generation parameters: a new one is a field here with its :class:`Param`
    (and its pass to the pipeline in ``worker/pipelines/generate.py``); the field order is the
    export's column order."""

    model: str = field(metadata={"param": Param(str, "string", _check_name)})
    adapter: str | None = _param(None, str, "string", _check_optional_name, flag=ADAPTER_HELP)
    adapter_scale: float = _param(
        1.0, float, "float64", partial(_check_float, lo=-MAX_ADAPTER_SCALE, hi=MAX_ADAPTER_SCALE),
        flag="Adapter weight, for rows without an adapter_scale cell", with_adapter=True,
    )  # fmt: skip
    width: int = _param(1024, int, "int32", _check_side, flag="Width (multiple of 8), for rows without a width cell")
    height: int = _param(1024, int, "int32", _check_side, flag="Height (multiple of 8), for rows without a height cell")
    steps: int = _param(
        30, int, "int32", partial(_check_int, lo=1, hi=MAX_STEPS), flag="Denoising steps, for rows without a steps cell"
    )
    guidance: float = _param(
        5.0, float, "float64", partial(_check_float, lo=0.0, hi=MAX_GUIDANCE),
        flag="Classifier-free guidance, for rows without a guidance cell",
    )  # fmt: skip
    sampler: str | None = _param(
        None, str, "string", check_sampler,
        flag=f"Sampler ({', '.join(SAMPLERS)}), for rows without a sampler cell; none: the model's own",
    )  # fmt: skip
    timestep_spacing: str | None = _param(
        None, str, "string", check_spacing,
        flag=f"The sampler's timestep spacing ({', '.join(SPACINGS)}); none: the sampler's own",
    )  # fmt: skip
    adapters: str | None = _param(
        None, str, "string", adapter_stack.check,
        flag="Several adapters with their weights, a.safetensors:0.8+b.safetensors:1, for rows without an "
        "adapters cell (instead of --adapter)",
    )  # fmt: skip
    image_format: str = _param(
        image_format.DEFAULT, str, "string", image_format.check,
        flag="The files' format: png, jpeg or webp, a quality after ':' (jpeg:90, webp:lossless), for rows "
        "without an image_format cell",
    )  # fmt: skip
    decoder: str | None = _param(
        None, str, "string", check_decoder,
        flag="A fast preview decoder in place of the VAE (SDXL models): madebyollin/taesdxl, a folder, or "
        "taesdxl-random / tiny-taesd, for rows without a decoder cell; none: the model's own VAE",
    )  # fmt: skip

    def __post_init__(self) -> None:
        # one spelling per format (JPG, jpeg:95 and jpeg are one): the format is part of an item's key
        try:
            canonical = image_format.parse(self.image_format).spec
        except (InvalidJobSpec, TypeError, AttributeError):
            return  # validate() says what is wrong
        if canonical != self.image_format:
            object.__setattr__(self, "image_format", canonical)

    def validate(self) -> GenParams:
        for f in fields(self):
            f.metadata["param"].check(f.name, getattr(self, f.name))
        _require(
            not (self.adapter and self.adapters),
            "adapter and adapters are both set: give one adapter, or all of them in adapters (a:0.8+b:1)",
        )
        return self

    @property
    def file_format(self) -> image_format.ImageFormat:
        """The format this chunk's images are written in."""
        return image_format.parse(self.image_format)

    def stack(self) -> adapter_stack.Stack:
        """The adapters this chunk runs with, each with its weight, in merge order."""
        if self.adapter:
            return ((self.adapter, float(self.adapter_scale)),)
        return adapter_stack.parse(self.adapters) if self.adapters else ()

    def record(self) -> dict[str, Any]:
        """The parameters as each image's metadata line and PNG text carry them."""
        return {
            f.name: None if f.metadata["param"].with_adapter and not self.adapter else getattr(self, f.name)
            for f in fields(self)
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> GenParams:
        """The parameters a metadata line was made with (``producer verify --repair``); a field
        the line does not carry (it was made before the field existed) has its default."""
        values: dict[str, Any] = {}
        for name, spec in PARAMS.items():
            value = record.get(name)
            if value is None or (spec.with_adapter and not record.get("adapter")):
                continue
            values[name] = value if spec.kind is str else spec.kind(value)
        return cls(**values)

    def short(self) -> str:
        adapter = " · " + " + ".join(f"{name}@{weight:g}" for name, weight in self.stack()) if self.stack() else ""
        sampler = f" · {self.sampler}" if self.sampler else ""
        spacing = f" ({self.timestep_spacing})" if self.timestep_spacing else ""
        return (
            f"{self.width}x{self.height} · {self.steps} steps · cfg {self.guidance:g}{sampler}{spacing} · "
            f"{self.model}{adapter}"
        )


#: every generation parameter by name, in declaration order
PARAMS: dict[str, Param] = {f.name: f.metadata["param"] for f in fields(GenParams)}
#: their defaults (``model`` has none)
PARAM_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(GenParams) if f.default is not MISSING}


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
    #: reward scores its worker computes for each image (``name=model``, common/scorers.py)
    scores: tuple[str, ...] = ()

    @property
    def num_images(self) -> int:
        return sum(item.num_images for item in self.items)

    def validate(self) -> JobSpec:
        self.params.validate()
        _check_text("output", self.output, max_chars=MAX_NAME_CHARS, allow_empty=False)
        _require(len(self.items) > 0, "a job needs at least one prompt")
        fmt = image_format.parse(self.params.image_format)
        for item in self.items:
            item.validate()
            image_format.check_fits(fmt, item.prompt, item.negative_prompt)
        if self.scores:
            scorers.check(self.scores)
        return self

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": SPEC_VERSION,
            "params": dict(self.params.__dict__),
            "output": self.output,
            "items": [dict(item.__dict__) for item in self.items],
        }
        if self.scores:  # only when asked: a payload without scores is the one it always was
            data["scores"] = list(self.scores)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> JobSpec:
        """Build and validate a spec from untrusted JSON; unknown or missing fields are errors."""
        _require(isinstance(data, dict), "job payload must be a JSON object")
        _require(data.get("v") == SPEC_VERSION, f"job payload version {data.get('v')!r} is not {SPEC_VERSION}")
        known = {"v", "params", "output", "items"}
        _require(known <= set(data) <= known | {"scores"}, f"job payload has fields {sorted(data)}")
        params = _build(GenParams, data["params"], "params")
        raw_items = data["items"]
        _require(isinstance(raw_items, list), "items must be a list")
        items = tuple(_build(PromptItem, raw, "item") for raw in raw_items)
        scores = data.get("scores", [])
        _require(isinstance(scores, list), "scores must be a list")
        return cls(params=params, output=data["output"], items=items, scores=tuple(scores)).validate()

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
