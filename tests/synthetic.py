"""A diffq output written directly (no pipeline): small PNGs under their content-derived names
and the metadata lines a worker writes. For what only reads an output (export tests, the
export benchmark): the names and fields come from the same functions the worker uses."""

from __future__ import annotations

import json
import random
from io import BytesIO
from pathlib import Path

from PIL import Image

from common.jobspec import GenParams, PromptItem
from common.naming import METADATA_FILE, image_relpath, item_key


def record(i: int, prompts: int) -> dict:
    params = GenParams(model="tiny", width=16, height=16, steps=3, adapter="tiny-dora" if i % 2 else None)
    item = PromptItem(prompt=f"synthetic prompt {i % prompts}", seed=i)
    key = item_key(params, item)
    return {
        "file_name": image_relpath(key, 0),
        "key": key,
        "index": 0,
        "id": None,
        "prompt": item.prompt,
        "negative_prompt": "",
        "seed": item.seed,
        "model": params.model,
        "adapter": params.adapter,
        "adapter_scale": 1.0 if params.adapter else None,
        "width": params.width,
        "height": params.height,
        "steps": params.steps,
        "guidance": params.guidance,
        "created": "2026-11-23T00:00:00+00:00",
    }


def png(i: int, side: int = 16) -> bytes:
    rng = random.Random(i)
    image = Image.frombytes("RGB", (side, side), bytes(rng.randrange(256) for _ in range(side * side * 3)))
    out = BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()


def write_local(out: Path, n: int, prompts: int | None = None) -> list[dict]:
    """``n`` images (two per prompt unless ``prompts`` says) under ``out`` and their metadata.jsonl."""
    records = [record(i, prompts or max(1, n // 2)) for i in range(n)]
    with open(out / METADATA_FILE, "w", encoding="utf-8") as meta:
        for i, rec in enumerate(records):
            path = out / rec["file_name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png(i))
            meta.write(json.dumps(rec, sort_keys=True) + "\n")
    return records
