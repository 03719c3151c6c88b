"""Reading prompts files (CSV with a header row, or JSONL) into validated rows, streaming.

Every problem is reported as ``FILE:LINE: reason`` so the user can jump to it; a problem
with the file as a whole (missing, empty, no ``prompt`` column, unknown columns) raises
:class:`InputFileError` at once. Nothing here touches Redis.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from common import adapter_stack
from common.errors import ConfigError, InputFileError, InvalidJobSpec
from common.jobspec import PARAM_DEFAULTS, PARAMS, GenParams, PromptItem
from common.naming import derived_seed
from common.presets import adapter_path, check_model, preset_default
from common.recipes import contradictions, recipe, recognised

#: a row's own columns (:class:`PromptItem`) and how each is read
ITEM_COLUMNS: dict[str, type] = {"prompt": str, "negative_prompt": str, "seed": int, "num_images": int, "id": str}
#: the generation parameters a row may set beside its model: all of :class:`GenParams` but the model
PARAM_COLUMNS: dict[str, type] = {name: p.kind for name, p in PARAMS.items() if name != "model"}
#: a row's model (a preset, a folder, a .safetensors file or a hub id); empty: ``--model``'s
MODEL_COLUMNS: dict[str, type] = {"model": str}
#: a row's recipe (common/recipes.py): settings for the parameters its cells leave empty
RECIPE_COLUMNS: dict[str, type] = {"recipe": str}
COLUMNS = (*ITEM_COLUMNS, *MODEL_COLUMNS, *PARAM_COLUMNS, *RECIPE_COLUMNS)
_KINDS = {**ITEM_COLUMNS, **MODEL_COLUMNS, **PARAM_COLUMNS, **RECIPE_COLUMNS}
INT_COLUMNS = {name for name, kind in _KINDS.items() if kind is int}
FLOAT_COLUMNS = {name for name, kind in _KINDS.items() if kind is float}
TEXT_COLUMNS = {name for name, kind in _KINDS.items() if kind is str}
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}
MAX_FIELD_CHARS = 200_000  # the csv module's own limit is 128 KiB; our prompt limit is far lower

csv.field_size_limit(max(MAX_FIELD_CHARS, 131072))


#: What the command-line flags give to rows that leave a column empty: the model, each
#: generation parameter (made from the declared list, :data:`~common.jobspec.PARAMS`, with the
#: job spec's defaults), the row defaults of :class:`PromptItem`, and ``check_paths`` (refuse
#: rows whose adapter path does not exist on this machine).
RowDefaults = make_dataclass(
    "RowDefaults",
    [
        ("model", str),
        *[(name, Any, field(default=default)) for name, default in PARAM_DEFAULTS.items()],
        ("num_images", int, field(default=PromptItem.__dataclass_fields__["num_images"].default)),
        ("seed", int | None, field(default=None)),
        ("check_paths", bool, field(default=True)),
        # --recipe (a row's recipe cell wins), and the parameters a flag gave, which win over a recipe
        ("recipe", str | None, field(default=None)),
        ("given", frozenset, field(default=frozenset())),
    ],
    frozen=True,
    kw_only=True,
)
RowDefaults.__module__ = __name__  # its repr names where it lives (the file fingerprint reads it)


@dataclass(frozen=True)
class Row:
    line: int
    params: GenParams
    item: PromptItem
    #: a known few-step adapter or model run against its recipe (said at enqueue, not refused)
    warning: str | None = None
    #: the columns this row gave a value (a cell wins over its flag)
    cells: frozenset[str] = frozenset()


@dataclass(frozen=True)
class RowError:
    line: int
    message: str


def file_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputFileError(f"{path}: unknown file type {path.suffix!r}; use .csv (with a header row) or .jsonl")
    return fmt


#: what surrogateescape turns a byte that is not UTF-8 into
_UNDECODABLE = re.compile("[\udc80-\udcff]")


def read_rows(path: Path, defaults: RowDefaults) -> Iterator[Row | RowError]:
    """Yield each data row of ``path`` as a validated :class:`Row` or a :class:`RowError`."""
    fmt = file_format(path)
    raw_rows = _iter_csv(path) if fmt == "csv" else _iter_jsonl(path)
    for line, raw in raw_rows:
        if isinstance(raw, str):
            yield RowError(line, raw)
            continue
        try:
            yield parse_row(line, raw, defaults)
        except InvalidJobSpec as exc:
            yield RowError(line, str(exc))


def parse_row(line: int, raw: dict[str, Any], defaults: RowDefaults) -> Row:
    """Turn one row's raw values (strings from CSV, JSON values from JSONL) into a :class:`Row`."""
    values = {name: _coerce(name, value) for name, value in raw.items()}
    values = {name: value for name, value in values.items() if value is not None}
    if "prompt" not in values:
        raise InvalidJobSpec("prompt is empty")
    # a row's adapter or adapters cell wins over both flags; both cells are refused by validate
    own = "adapter" in values or "adapters" in values
    adapter = values.get("adapter") if own else defaults.adapter
    stack = values.get("adapters") if own else defaults.adapters
    if adapter:
        adapter = _adapter_path(adapter, defaults.check_paths)
    if stack:
        stack = _stack_text(stack, defaults.check_paths)
    named = values.get("recipe", defaults.recipe)
    settings = recipe(named).settings() if named else {}
    model = values.get("model", defaults.model)
    if model != defaults.model:
        _check_model(model)

    def value(name: str) -> Any:
        """A cell, else a flag given, else the recipe's, else the default (the row's model
        preset's own: a ``tiny`` row is 128² where an SDXL one is 1024²)."""
        if name in values:
            return values[name]
        if name in settings and name not in defaults.given:
            return settings[name]
        if model != defaults.model and name not in defaults.given:
            return preset_default(model, name, PARAM_DEFAULTS[name])
        return getattr(defaults, name)

    params = _params(
        model=model,
        adapter=adapter,
        adapters=stack,
        **{  # a parameter that needs an adapter keeps its default without one
            name: _kind(kind, value(name)) if adapter or not PARAMS[name].with_adapter else PARAM_DEFAULTS[name]
            for name, kind in PARAM_COLUMNS.items()
            if name not in ("adapter", "adapters")
        },
    )
    prompt = values["prompt"]
    negative = values.get("negative_prompt", "")
    row_id = values.get("id")
    seed = values.get("seed", defaults.seed)
    if seed is None and isinstance(prompt, str) and isinstance(negative, str):
        seed = derived_seed(prompt, negative, row_id)
    item = PromptItem(
        prompt=prompt,
        negative_prompt=negative,
        seed=seed,
        num_images=values.get("num_images", defaults.num_images),
        id=row_id,
    ).validate()
    return Row(line=line, params=params, item=item, warning=_against_recipe(params, named), cells=frozenset(values))


def _against_recipe(params: GenParams, named: str | None) -> str | None:
    """A known few-step adapter or model whose row contradicts its recipe, in one line."""
    adapter = next((name for name, _ in params.stack() if recognised(name)), None)
    found = recognised(adapter, params.model)
    if found is None or named == found[0]:
        return None
    said = contradictions(found[1], params.__dict__)
    if not said:
        return None
    what = f"adapter {Path(adapter).name!r}" if adapter else f"model {params.model!r}"
    return f"{what} looks like {found[1].what}, run with {', '.join(said)}: --recipe {found[0]} (or a recipe cell)"


def _kind(kind: type, value: Any) -> Any:
    """A float parameter given as a whole number (``5`` in JSON) is still a float: the same
    chunk, the same key as ``5.0``."""
    return float(value) if kind is float and isinstance(value, int) and not isinstance(value, bool) else value


@functools.lru_cache(maxsize=4096)
def _params(**values: Any) -> GenParams:
    """Rows of a file mostly share their settings: build and validate each combination once."""
    return GenParams(**values).validate()


@functools.lru_cache(maxsize=256)
def _check_model(model: str) -> None:
    """A model cell, checked as ``--model`` is (once per distinct cell): a typo is this row's
    error, not every worker's failed job."""
    try:
        check_model(model)
    except ConfigError as exc:
        raise InvalidJobSpec(str(exc).replace("--model ", "model ", 1)) from None


@functools.lru_cache(maxsize=1024)
def _adapter_path(adapter: str, check: bool) -> str:
    """The adapter as jobs store it (absolute, checked once per distinct cell)."""
    return adapter_path(adapter, check=check)


@functools.lru_cache(maxsize=1024)
def _stack_text(text: str, check: bool) -> str:
    """An adapters cell as jobs store it: each adapter absolute and checked, weights as ``%g``."""
    return adapter_stack.canonical(text, lambda adapter: _adapter_path(adapter, check))


def _coerce(name: str, value: Any) -> Any:
    """Empty cells and JSON nulls mean "use the default"; strings from CSV become numbers."""
    if value is None or (isinstance(value, str) and value.strip() == "" and name != "prompt"):
        return None
    if isinstance(value, str) and _UNDECODABLE.search(value):
        raise InvalidJobSpec(f"{name} is not valid UTF-8")
    if name in TEXT_COLUMNS:
        if not isinstance(value, str):
            raise InvalidJobSpec(f"{name} must be text, not {type(value).__name__}")
        return value
    if isinstance(value, bool):
        raise InvalidJobSpec(f"{name} must be a number, not {str(value).lower()}")
    if name in INT_COLUMNS:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise InvalidJobSpec(f"{name} {value!r} is not a whole number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise InvalidJobSpec(f"{name} {value!r} is not a number") from None
        if not math.isfinite(number):
            raise InvalidJobSpec(f"{name} must be a finite number, not {value.strip()}")
        return number
    raise InvalidJobSpec(f"{name} must be a number, not {type(value).__name__}")


def _check_columns(path: Path, columns: list[str]) -> None:
    unknown = [c for c in columns if c not in COLUMNS]
    if "prompt" not in columns:
        hint = f" (found {', '.join(map(repr, unknown))})" if unknown else ""
        raise InputFileError(f"{path}:1: no 'prompt' column{hint}; the header row must name one")
    if unknown:
        raise InputFileError(
            f"{path}:1: unknown column(s) {', '.join(map(repr, unknown))}; known columns: {', '.join(COLUMNS)}"
        )


def _open_text(path: Path):
    try:
        # surrogateescape: a broken UTF-8 byte becomes a marker we report with its line number
        return path.open("r", encoding="utf-8-sig", errors="surrogateescape", newline="")
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a folder, not a prompts file") from None
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read ({exc.strerror})") from None


def _iter_csv(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    with _open_text(path) as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
        except csv.Error as exc:
            raise InputFileError(f"{path}:1: cannot parse the header row ({exc})") from None
        if header is None or not any(h.strip() for h in header):
            raise InputFileError(f"{path}: empty file; expected a header row with a 'prompt' column")
        columns = [h.strip() for h in header]
        _check_columns(path, columns)
        if len(set(columns)) != len(columns):
            raise InputFileError(f"{path}:1: a column is named twice in the header row")
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield reader.line_num, f"cannot parse the row ({exc})"
                continue
            if not cells or all(c.strip() == "" for c in cells):
                continue
            if len(cells) != len(columns):
                yield reader.line_num, f"row has {len(cells)} fields but the header has {len(columns)}"
                continue
            if any("\x00" in c for c in cells):
                yield reader.line_num, "row contains a NUL byte"
                continue
            yield reader.line_num, dict(zip(columns, cells, strict=True))


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    with _open_text(path) as handle:
        seen_any = False
        for line_no, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            seen_any = True
            if any("\udc80" <= ch <= "\udcff" for ch in text):
                yield line_no, "line is not valid UTF-8"
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                yield line_no, f"not valid JSON ({exc.msg})"
                continue
            if not isinstance(value, dict):
                yield line_no, f"expected a JSON object, got {type(value).__name__}"
                continue
            unknown = [k for k in value if k not in COLUMNS]
            if unknown:
                yield line_no, f"unknown key(s) {', '.join(map(repr, unknown))}; known keys: {', '.join(COLUMNS)}"
                continue
            yield line_no, value
        if not seen_any:
            raise InputFileError(f"{path}: empty file; expected one JSON object per line")


def count_lines(path: Path) -> int:
    """Physical lines in the file (for a progress bar's total), read in binary chunks."""
    count = 0
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            count += block.count(b"\n")
    return count
