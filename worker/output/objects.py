"""Writing images and metadata to an object store (``s3://bucket/prefix`` or any fsspec URL).

Each image is one PUT under its content-derived name: an object is visible whole or not at
all, so there are no temp names. ``metadata.jsonl`` cannot be appended to on an object store,
so each execution of a job writes its lines as one part, ``metadata/<job id>.<execution>.jsonl``,
before the ledger's COMMIT marks the items done: "done" in Redis means the images and their
lines are in the bucket.

Exactly-once lines: BEGIN tells an execution which items are recorded already, and it writes
lines only for the others. The one way a line can be in two parts is an execution that loses
its job (stalled past the heartbeat TTL) after writing its part: its COMMIT fails and it deletes
the part, unless it is killed between the two. ``producer export`` merges the parts sorted by
``file_name`` and keeps one line per image, so the dataset has every image once either way.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from typing import Any

from common.errors import ConfigError, OutputNotWritable, OutputUnavailable
from common.storage import PARALLEL, Store, problem


def prepare_store(location: str, allowed_root: str = "", endpoint_url: str = "") -> Store:
    """The job's object-store output, refused at once when ``DIFFQ_OUTPUT_ROOT`` does not allow it."""
    if allowed_root and not location.rstrip("/").startswith(allowed_root.rstrip("/")):
        raise OutputNotWritable(f"output {location!r} is outside DIFFQ_OUTPUT_ROOT={allowed_root}; refused")
    return Store(location, endpoint_url)


def unavailable(store: Store, exc: BaseException) -> OutputUnavailable | None:
    """The worker-side error for a storage failure (endpoint gone, credentials, bucket), or None
    when ``exc`` is not about the storage."""
    # s3fs missing on this worker is its environment too: pause and say so, fail no job
    line = str(exc) if isinstance(exc, ConfigError) else problem(exc, store.location, store.endpoint_url)
    if line is None:
        return None
    return OutputUnavailable(f"{line} (from this worker)", output=store.location)


def put_all(store: Store, blobs: dict[str, bytes]) -> None:
    """PUT every object, a few at a time; any failure is the storage's, not the job's."""
    if not blobs:
        return
    try:
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(blobs))) as pool:
            list(pool.map(lambda pair: store.put(*pair), blobs.items()))
    except Exception as exc:
        err = unavailable(store, exc)
        if err is None:
            raise
        raise err from None


def existing(store: Store, rels: list[str]) -> set[str]:
    try:
        return store.existing(rels)
    except Exception as exc:
        err = unavailable(store, exc)
        if err is None:
            raise
        raise err from None


def part_bytes(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records).encode("utf-8")


def drop_part(store: Store, rel: str) -> None:
    """Best effort: the part of an execution that lost its job (the merge dedups anyway)."""
    with suppress(Exception):  # nothing more to do: export keeps one line per image
        store.delete(rel)


def probe_store(location: str, endpoint_url: str = "") -> None:
    """Can this worker write there now? One small object written and deleted."""
    store = Store(location, endpoint_url)
    try:
        store.probe()
    except Exception as exc:
        err = unavailable(store, exc)
        if err is None:
            raise
        raise err from None
