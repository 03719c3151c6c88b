"""Reading an output's metadata as a stream: ``metadata.jsonl`` (a local folder) and the
per-execution parts under ``metadata/`` (an object store, where nothing can be appended).

Export, verify and enqueue's check for missing images all read it through here, so they agree
on what a line is: a whole JSON object with a ``file_name``; anything else is a fragment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from common.naming import METADATA_FILE, METADATA_PARTS_DIR
from common.storage import Store

#: metadata parts read at once from an object store
PART_BATCH = 64


@dataclass(frozen=True)
class Line:
    """One line of metadata: where it is (file, byte offset or line number) and what it holds."""

    source: str  # METADATA_FILE or a part's name
    position: int  # byte offset in metadata.jsonl, line number in a part
    text: str
    record: dict[str, Any] | None  # None: not a whole record (a fragment, or not JSON)

    @property
    def file_name(self) -> str | None:
        if self.record is None:
            return None
        name = self.record.get("file_name", self.record.get("file"))  # "file" before 2026-11
        return name if isinstance(name, str) else None


def metadata_files(store: Store) -> list[str]:
    files = sorted(r for r in store.listing(METADATA_PARTS_DIR) if r.endswith(".jsonl"))
    if store.exists(METADATA_FILE):
        files.insert(0, METADATA_FILE)
    return files


def parse(text: str) -> dict[str, Any] | None:
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


#: what a worker's line looks like (``json.dumps(sort_keys=True)``), for :func:`quick`
_FILE_NAME = re.compile(r'"file_name": "([^"\\]+)"')
_NUM_IMAGES = re.compile(r'"num_images": (\d+)')


def quick(text: str) -> dict[str, Any] | None:
    """The fields verify needs from a line, without parsing all of it (json.loads is most of
    the time of a pass over 10^7 lines): a line a worker wrote is one object from ``{`` to
    ``}``. What does not look so is parsed in full, so a fragment is still found."""
    if text.startswith("{") and text.endswith("}") and (name := _FILE_NAME.search(text)):
        number = _NUM_IMAGES.search(text)
        return {"file_name": name[1], "num_images": int(number[1]) if number else None}
    return parse(text)


def read(store: Store, files: list[str], *, fast: bool = False) -> Iterator[Line]:
    """Every non-empty line of ``files``: the big local file streamed, small parts fetched a
    batch at a time (concurrent requests on an object store). ``fast``: records hold only
    what :func:`quick` takes."""
    parse_ = quick if fast else parse
    parts: list[str] = []
    for rel in files:
        if rel != METADATA_FILE:
            parts.append(rel)
            continue
        offset = 0
        with store.fs.open(store.path(rel), "rb") as handle:
            for raw in handle:
                text = raw.decode("utf-8", errors="replace").strip()
                if text:
                    yield Line(rel, offset, text, parse_(text))
                offset += len(raw)
    for start in range(0, len(parts), PART_BATCH):
        got = store.read_many(parts[start : start + PART_BATCH], missing_ok=True)
        for rel in parts[start : start + PART_BATCH]:
            for number, raw in enumerate(got.get(rel, b"").decode("utf-8", errors="replace").split("\n")):
                text = raw.strip()
                if text:
                    yield Line(rel, number, text, parse_(text))


def recorded_names(store: Store) -> set[str]:
    """The image names that have a whole metadata line (one pass over all of it)."""
    return {name for line in read(store, metadata_files(store), fast=True) if (name := line.file_name)}
