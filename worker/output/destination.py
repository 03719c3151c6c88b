"""Where a job's images and metadata lines go: a local folder or an object-store prefix, behind
one protocol, so the job function never asks which one it has.

Both keep the same promise (see :mod:`common.ledger`): images are written whole under names
derived from their content; a job's lines are recorded once, in one step fenced on the job's
execution. They differ in how a step is made whole. A folder appends to ``metadata.jsonl``
under its lock (:mod:`common.metadata_log`), and a later execution that finds an earlier one's
intent reads the file from that offset instead of writing the lines twice. A bucket has no
append: each execution PUTs its own metadata part, and withdraws it if it lost the job.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from PIL import Image

from common.metadata_log import MetadataLog
from common.naming import metadata_part
from common.settings import Settings
from common.storage import Store, is_url
from worker.output.images import (
    ENVIRONMENT_ERRNOS,
    check_space,
    drop_temp_dir,
    image_bytes,
    locked_metadata,
    prepare_output,
    remove_stale_temps,
    temp_dir,
    unavailable,
    write_atomic,
)
from worker.output.objects import drop_part, existing, part_bytes, prepare_store, put_all

#: beyond the raw pixels, the worst case bytes of one image file (random noise barely compresses
#: as PNG) plus its metadata line
FILE_OVERHEAD = 8192


class Journal(Protocol):
    """A destination's metadata, held for one record step."""

    #: where this step's lines start (a folder's file size; 0 on a bucket)
    offset: int

    def already_there(self, offset: int, names: set[str]) -> set[str]:
        """Which of ``names`` an earlier execution wrote from ``offset`` on."""
        ...

    def write(self, lines: list[dict[str, Any]]) -> None: ...

    def withdraw(self) -> str:
        """This execution lost the job after writing: take back what can be, and say what."""
        ...


class Destination(Protocol):
    #: as the job named it (the job's result says it)
    location: str

    def existing(self, rels: list[str]) -> set[str]:
        """Which of the image paths are there already (an earlier attempt wrote them)."""
        ...

    def make_room(self, rels: list[str], bytes_each: int) -> None:
        """Before any GPU time: room for these images, and no temp file of a dead attempt."""
        ...

    def write_images(self, records: list[dict[str, Any]], images: list[Image.Image]) -> None:
        """Each image whole under its record's ``file_name``, its parameters inside."""
        ...

    def journal(self, job_id: str, execution: str | None) -> AbstractContextManager[Journal]: ...


def open_destination(location: str, settings: Settings) -> Destination:
    """A local folder (created now) or an object-store prefix."""
    if is_url(location):
        return Bucket(location, prepare_store(location, settings.output_root, settings.s3_endpoint_url))
    return Folder(prepare_output(location, settings.output_root))


class Folder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def existing(self, rels: list[str]) -> set[str]:
        return {rel for rel in rels if (self.path / rel).exists()}

    def make_room(self, rels: list[str], bytes_each: int) -> None:
        for rel in rels:
            remove_stale_temps(self.path / rel, temp_dir(self.path))
        check_space(self.path, len(rels) * (bytes_each + FILE_OVERHEAD))

    def write_images(self, records: list[dict[str, Any]], images: list[Image.Image]) -> None:
        """Temp file and rename, a thread per image: Pillow's encoders release the GIL. A full or
        read-only disk is the worker's problem, not the job's."""

        def save(pair: tuple[dict[str, Any], Image.Image]) -> None:
            record, image = pair
            path = self.path / record["file_name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, image_bytes(image, record), temp_dir(self.path))

        try:
            with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
                list(pool.map(save, zip(records, images, strict=True)))
        except OSError as exc:
            if exc.errno in ENVIRONMENT_ERRNOS:
                raise unavailable(self.path, exc) from None
            raise
        finally:
            drop_temp_dir(self.path)

    @contextmanager
    def journal(self, job_id: str, execution: str | None) -> Iterator[Journal]:
        with locked_metadata(self.path) as meta:
            yield _FileJournal(self.path, meta)


class _FileJournal:
    def __init__(self, path: Path, meta: MetadataLog) -> None:
        self.path, self.meta = path, meta
        self.offset = meta.size

    def already_there(self, offset: int, names: set[str]) -> set[str]:
        return self.meta.files_from(offset, names)

    def write(self, lines: list[dict[str, Any]]) -> None:
        try:
            self.meta.append(lines)
        except OSError as exc:
            raise unavailable(self.path, exc) from None

    def withdraw(self) -> str:
        """The lines stay: the next owner finds this execution's intent and does not repeat them."""
        return "the next owner reconciles"


class Bucket:
    def __init__(self, location: str, store: Store) -> None:
        self.location, self.store = location, store

    def existing(self, rels: list[str]) -> set[str]:
        return existing(self.store, rels)

    def make_room(self, rels: list[str], bytes_each: int) -> None:
        """A bucket has no "full" and no temp files: every object is one PUT."""

    def write_images(self, records: list[dict[str, Any]], images: list[Image.Image]) -> None:
        with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
            blobs = list(pool.map(lambda pair: image_bytes(pair[1], pair[0]), zip(records, images, strict=True)))
        put_all(self.store, {r["file_name"]: blob for r, blob in zip(records, blobs, strict=True)})

    @contextmanager
    def journal(self, job_id: str, execution: str | None) -> Iterator[Journal]:
        yield _PartJournal(self.store, metadata_part(job_id, execution or f"{time.time_ns()}"))


class _PartJournal:
    """This execution's own metadata part: nothing else ever writes it."""

    offset = 0

    def __init__(self, store: Store, name: str) -> None:
        self.store, self.name = store, name
        self.written = False

    def already_there(self, offset: int, names: set[str]) -> set[str]:
        return set()  # an earlier execution's lines are in its own part, which BEGIN accounts for

    def write(self, lines: list[dict[str, Any]]) -> None:
        if lines:
            put_all(self.store, {self.name: part_bytes(lines)})
            self.written = True

    def withdraw(self) -> str:
        if self.written:
            drop_part(self.store, self.name)
        return "its metadata part is withdrawn"
