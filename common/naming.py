"""Content-derived names: item keys, job ids, derived seeds and image paths.

Everything that identifies work is a hash of what the work *is*, so that enqueuing a file
again finds what is already queued or done, and a retried job writes to the same names.
File names come only from these hex digests, never from user text, so no prompt or id can
steer a write outside the output folder.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from json.encoder import encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from common.jobspec import KEY_FIELDS_V1, GenParams, PromptItem

KEY_CHARS = 24  # 96 bits: no collision expected below ~10^14 items
JOB_PREFIX = "dq"
IMAGES_DIR = "images"
METADATA_FILE = "metadata.jsonl"
#: on an object store, where nothing can be appended, each job execution writes one part here
METADATA_PARTS_DIR = "metadata"


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# derived_seed and item_key run once per row of a prompts file (10^7 rows in a big campaign), so
# they write the JSON text that ``_digest`` would write by hand: the same bytes (sorted keys, no
# spaces, text escaped by the encoder json.dumps itself uses), three times faster.
# tests/test_naming.py checks them against ``_digest`` on random rows.


def _scalar(value: str | int | float | None) -> str:
    """One JSON value, exactly as ``json.dumps(..., ensure_ascii=False)`` writes it."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring(value)
    return repr(value)  # int.__repr__ / float.__repr__: what json uses for finite numbers


def derived_seed(prompt: str, negative_prompt: str = "", row_id: str | None = None) -> int:
    """A seed for a row that gave none: stable across runs and machines, different per prompt."""
    text = (
        f'{{"id":{_scalar(row_id)},"negative_prompt":{encode_basestring(negative_prompt)},'
        f'"prompt":{encode_basestring(prompt)},"seed":1}}'
    )
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


@functools.lru_cache(maxsize=4096)
def _params_json(params: GenParams) -> tuple[str, str, str]:
    """The parts of an item's key text that come from its chunk's settings (shared by many rows)."""
    scale = float(params.adapter_scale) if params.adapter else None
    head = (
        f'{{"adapter":{_scalar(params.adapter)},"adapter_scale":{_scalar(scale)},'
        f'"guidance":{_scalar(float(params.guidance))},"height":{_scalar(params.height)},'
    )
    later = {  # fields added after the first key version, only where they change the pixels
        f.name: getattr(params, f.name)
        for f in dataclasses.fields(params)
        if f.name not in KEY_FIELDS_V1 and getattr(params, f.name) != f.default
    }
    extra = f',"later":{json.dumps(later, sort_keys=True, ensure_ascii=False, separators=(",", ":"))}' if later else ""
    return (
        head,
        f'"model":{_scalar(params.model)},',
        f'"steps":{_scalar(params.steps)},"width":{_scalar(params.width)}{extra}}}',
    )


def item_key(params: GenParams, item: PromptItem) -> str:
    """The identity of one row's images: everything that changes the pixels, plus the row id.

    The digest of ``{"model", "adapter", "adapter_scale" (None without an adapter), "width",
    "height", "steps", "guidance", "prompt", "negative_prompt", "seed", "num_images", "id"}``."""
    head, model, tail = _params_json(params)
    text = (
        f'{head}"id":{_scalar(item.id)},{model}"negative_prompt":{encode_basestring(item.negative_prompt)},'
        f'"num_images":{item.num_images!r},"prompt":{encode_basestring(item.prompt)},"seed":{item.seed!r},{tail}'
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:KEY_CHARS]


def job_id(keys: list[str], output: str, queue: str) -> str:
    """A chunk's job id: its items' keys, where they go and the queue it is on (RQ keeps one job
    hash per id across queues). Contains no ':' (RQ key separator)."""
    return f"{JOB_PREFIX}{_digest({'keys': keys, 'output': output, 'queue': queue})[:KEY_CHARS]}"


def output_id(location: str) -> str:
    """A short name for an output (a folder or a bucket prefix, as ``producer enqueue`` wrote it
    into the job): the ledger marks each done item with the output that holds it, so
    ``producer verify`` of one output checks that output's items only."""
    return _digest({"output": location.rstrip("/")})[:8]


def image_relpath(key: str, index: int, extension: str = "png") -> str:
    """Path of image ``index`` of an item, relative to the output folder; ``extension`` is its
    format's (:mod:`common.image_format`).

    Sharded by the first two hex digits so a folder never holds more than ~1/256 of a dataset.
    """
    if len(key) != KEY_CHARS or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not an item key: {key!r}")
    return f"{IMAGES_DIR}/{key[:2]}/{key}-{index}.{extension}"


def metadata_part(job_id: str, execution: str) -> str:
    """The metadata part one execution of a job writes on an object store. Unique per execution,
    so a later execution never overwrites lines an earlier one recorded (see
    :mod:`worker.output.objects`)."""
    return f"{METADATA_PARTS_DIR}/{job_id}.{_digest({'execution': execution})[:12]}.jsonl"


def image_path(output: str | Path, key: str, index: int, extension: str = "png") -> Path:
    return Path(output) / image_relpath(key, index, extension)
