"""``metadata.jsonl``: one JSON line per image, appended by every writer of a local output under
one exclusive ``flock``, so several workers on one machine (or one NFS export with lock
support) never interleave lines.

The lock protocol lives here because two sides keep it: workers append (``worker.output``)
and ``producer verify --repair`` replaces the file by a rename while holding the lock; a
writer that opened the old file and then got the lock sees the inode changed and opens again.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


class MetadataLog:
    """``metadata.jsonl`` held under an exclusive ``flock`` (see :func:`locked_metadata`).

    Written with ``pwrite`` on the raw descriptor: no Python buffer that could be flushed (and
    fail) at close, after the error was handled. An append is all or nothing: on any error the
    file is cut back to its size before the append, so a full disk never leaves a partial line.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def lines_from(self, offset: int) -> Iterator[bytes]:
        """Whole lines from byte ``offset`` on; a torn last line is not a line."""
        rest = b""
        while block := os.pread(self.fd, 1 << 20, offset):
            offset += len(block)
            *lines, rest = (rest + block).split(b"\n")
            yield from lines

    def files_from(self, offset: int, files: set[str]) -> set[str]:
        """Which of ``files`` have a line at or after byte ``offset`` (where an earlier execution
        of the same items was about to append)."""
        found: set[str] = set()
        for raw in self.lines_from(offset):
            try:
                record = json.loads(raw)
                name = record.get("file_name", record.get("file"))  # "file" before 2026-11
            except (ValueError, AttributeError):
                continue
            if name in files:
                found.add(name)
        return found

    def cut_torn_tail(self) -> int:
        """Remove a last line without its newline (a writer killed mid-write: we hold the lock, so
        no live writer is writing it). Returns the bytes removed."""
        end = self.size
        if not end or os.pread(self.fd, 1, end - 1) == b"\n":
            return 0
        start = max(0, end - (1 << 20))
        while True:
            block = os.pread(self.fd, end - start, start)
            cut = block.rfind(b"\n")
            if cut >= 0 or start == 0:
                keep = start + cut + 1 if cut >= 0 else 0
                break
            start = max(0, start - (1 << 20))
        os.ftruncate(self.fd, keep)
        return end - keep

    def append(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        data = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records).encode("utf-8")
        end = self.size
        try:
            view = memoryview(data)
            while view:
                view = view[os.pwrite(self.fd, view, end + len(data) - len(view)) :]
            os.fsync(self.fd)
        except BaseException:
            with suppress(OSError):
                os.ftruncate(self.fd, end)  # never a partial line, whatever stopped the write
                os.fsync(self.fd)
            raise


@contextmanager
def open_locked(path: Path) -> Iterator[MetadataLog]:
    """``path`` opened (created if need be) under an exclusive ``flock``, a torn last line cut.
    Closing drops the lock; nothing is buffered, so closing cannot fail."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass  # renamed away between the open and the stat: open again
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        log = MetadataLog(fd)
        log.cut_torn_tail()
        yield log
    finally:
        os.close(fd)
