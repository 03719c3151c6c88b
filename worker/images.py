"""Writing images and their metadata so that a crash never leaves a half-written file.

An image is written to a temporary name in its final folder, flushed, then renamed: readers
see either nothing or the whole PNG. ``metadata.jsonl`` gets one line per image, appended
under an exclusive ``flock`` so several workers on one machine (or one NFS export with lock
support) never interleave lines.
"""

from __future__ import annotations

import fcntl
import json
import os
from io import BytesIO
from pathlib import Path
from typing import Any

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from common.errors import OutputNotWritable
from common.naming import METADATA_FILE


def png_bytes(image: Image.Image, params: dict[str, Any]) -> bytes:
    """Encode ``image`` as PNG with the prompt in a ``prompt`` text chunk and every parameter
    as JSON in a ``diffq`` chunk (iTXt, so any Unicode survives)."""
    info = PngInfo()
    info.add_itxt("prompt", params.get("prompt", ""))
    info.add_itxt("diffq", json.dumps(params, ensure_ascii=False, sort_keys=True))
    buffer = BytesIO()
    image.save(buffer, format="PNG", pnginfo=info, compress_level=1)
    return buffer.getvalue()


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def prepare_output(output: str | Path, allowed_root: str = "") -> Path:
    """Create the output folder (or fail at once with a reason the user can act on).

    A job names its own output folder, so whoever can write to Redis could point workers at
    any folder they can write; ``DIFFQ_OUTPUT_ROOT`` confines them to one tree.
    """
    root = Path(output)
    if not root.is_absolute():
        raise OutputNotWritable(f"output folder {str(output)!r} is not an absolute path")
    if allowed_root and not root.resolve().is_relative_to(Path(allowed_root).resolve()):
        raise OutputNotWritable(f"output folder {str(output)!r} is outside DIFFQ_OUTPUT_ROOT={allowed_root}; refused")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".diffq-write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputNotWritable(
            f"output folder {str(output)!r} is not writable on this worker: {exc.strerror}"
        ) from None
    return root


def remove_stale_temps(path: Path) -> int:
    """Delete temp files a killed writer left for ``path``; the job now belongs to us."""
    removed = 0
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
        removed += 1
    return removed


def recorded_files(output: Path, files: set[str]) -> set[str]:
    """Which of ``files`` already have a line in ``metadata.jsonl``.

    Only needed when a retry finds images an interrupted attempt wrote (rare), so reading
    the whole file then is fine; the common path never reads it.
    """
    found: set[str] = set()
    path = output / METADATA_FILE
    if not files or not path.exists():
        return found
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            try:
                name = json.loads(line).get("file")
            except (ValueError, AttributeError):
                continue  # a torn last line from a killed writer is not a record
            if name in files:
                found.add(name)
    return found


def append_metadata(output: Path, records: list[dict[str, Any]]) -> None:
    if not records:
        return
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
    with open(output / METADATA_FILE, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            end = handle.seek(0, os.SEEK_END)
            if end:
                handle.seek(end - 1)
                if handle.read(1) != b"\n":
                    text = "\n" + text  # end a line torn by a writer that was killed mid-write
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
