"""Content-derived names: item keys, job ids, derived seeds and image paths.

Everything that identifies work is a hash of what the work *is*, so that enqueuing a file
again finds what is already queued or done, and a retried job writes to the same names.
File names come only from these hex digests, never from user text, so no prompt or id can
steer a write outside the output folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from common.jobspec import GenParams, PromptItem

KEY_CHARS = 24  # 96 bits: no collision expected below ~10^14 items
JOB_PREFIX = "dq"
IMAGES_DIR = "images"
METADATA_FILE = "metadata.jsonl"
#: on an object store, where nothing can be appended, each job execution writes one part here
METADATA_PARTS_DIR = "metadata"


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def derived_seed(prompt: str, negative_prompt: str = "", row_id: str | None = None) -> int:
    """A seed for a row that gave none: stable across runs and machines, different per prompt."""
    digest = _digest({"seed": 1, "prompt": prompt, "negative_prompt": negative_prompt, "id": row_id})
    return int(digest[:8], 16)


def item_key(params: GenParams, item: PromptItem) -> str:
    """The identity of one row's images: everything that changes the pixels, plus the row id."""
    return _digest(
        {
            "model": params.model,
            "adapter": params.adapter,
            "adapter_scale": float(params.adapter_scale) if params.adapter else None,
            "width": params.width,
            "height": params.height,
            "steps": params.steps,
            "guidance": float(params.guidance),
            "prompt": item.prompt,
            "negative_prompt": item.negative_prompt,
            "seed": item.seed,
            "num_images": item.num_images,
            "id": item.id,
        }
    )[:KEY_CHARS]


def job_id(keys: list[str], output: str, queue: str) -> str:
    """A chunk's job id: its items' keys, where they go and the queue it is on (RQ keeps one job
    hash per id across queues). Contains no ':' (RQ key separator)."""
    return f"{JOB_PREFIX}{_digest({'keys': keys, 'output': output, 'queue': queue})[:KEY_CHARS]}"


def image_relpath(key: str, index: int) -> str:
    """Path of image ``index`` of an item, relative to the output folder.

    Sharded by the first two hex digits so a folder never holds more than ~1/256 of a dataset.
    """
    if len(key) != KEY_CHARS or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not an item key: {key!r}")
    return f"{IMAGES_DIR}/{key[:2]}/{key}-{index}.png"


def metadata_part(job_id: str, execution: str) -> str:
    """The metadata part one execution of a job writes on an object store. Unique per execution,
    so a later execution never overwrites lines an earlier one recorded (see
    :mod:`worker.output.objects`)."""
    return f"{METADATA_PARTS_DIR}/{job_id}.{_digest({'execution': execution})[:12]}.jsonl"


def image_path(output: str | Path, key: str, index: int) -> Path:
    return Path(output) / image_relpath(key, index)
