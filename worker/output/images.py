"""Writing images and their metadata so that a crash never leaves a half-written file.

An image is written to a temporary name in the output's ``.diffq-tmp`` folder, flushed, then
renamed into place: readers see either nothing or the whole image. ``metadata.jsonl`` gets one line per image, appended
under an exclusive ``flock`` so several workers on one machine (or one NFS export with lock
support) never interleave lines, and an append that fails (a full disk) is cut back: the file
never holds a partial line.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO

from PIL import Image

from common import image_format
from common.errors import OutputNotWritable, OutputRefused, OutputUnavailable
from common.metadata_log import MetadataLog, open_locked
from common.naming import METADATA_FILE
from common.processes import alive

#: what a full, read-only or vanished output folder raises; none of them is the job's fault
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOENT,
                      errno.ESTALE, errno.ENOTCONN}  # fmt: skip
#: bytes kept free on the output's filesystem beyond what a job writes (metadata, other writers)
SPACE_RESERVE = 1 << 20
#: a temp file this old is a dead writer's, even on another host sharing the folder
STALE_TEMP_S = 3600
PROBE_BYTES = 64 << 10
TEMP_DIR = ".diffq-tmp"


def image_bytes(image: Image.Image, params: dict[str, Any]) -> bytes:
    """Encode ``image`` in the format its parameters name (PNG unless ``image_format`` says
    otherwise), every parameter inside (see :mod:`common.image_format`)."""
    return image_format.parse(params.get("image_format") or image_format.DEFAULT).encode(image, params)


#: of those, what stops every job of this worker, not only this job's: the disk or the mount
WORKER_WIDE = ENVIRONMENT_ERRNOS - {errno.EACCES, errno.EPERM}


def unavailable(output: str | Path, exc: OSError) -> OutputUnavailable | OutputRefused:
    """The worker-side error for an OSError while writing under ``output``: a full, read-only or
    vanished disk pauses the worker (:class:`OutputUnavailable`); anything that concerns this
    job's folder alone (a file in its place, no permission) gives the job back and the worker
    goes on (:class:`OutputRefused`)."""
    why = exc.strerror or exc.__class__.__name__
    text = f"output folder {str(output)!r} is not writable on this worker: {why}"
    if exc.errno in WORKER_WIDE:
        return OutputUnavailable(text, output=str(output))
    return OutputRefused(text)


def _host() -> str:
    return socket.gethostname().split(".")[0]


def temp_dir(output: Path) -> Path:
    """Where writers of ``output`` keep their temp files: one small folder, so looking for a
    dead writer's leftovers never lists an image folder (at 10^7 images each of the 256 holds
    ~40,000 files). Same filesystem as the images, so the rename is atomic."""
    return output / TEMP_DIR


def write_atomic(path: Path, data: bytes, temps: Path) -> None:
    """Write to ``<temps>/<name>.<host>.<pid>.tmp``, fsync, rename to ``path``: a reader sees all or nothing."""
    tmp = temps / f"{path.name}.{_host()}.{os.getpid()}.tmp"
    try:
        with _create(tmp) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _create(tmp: Path) -> BinaryIO:
    """Open ``tmp`` for writing, making its folder; another writer may remove the folder when
    it finds it empty (:func:`drop_temp_dir`) between our mkdir and our open: then again."""
    for attempt in range(5):
        tmp.parent.mkdir(exist_ok=True)
        try:
            return open(tmp, "wb")
        except FileNotFoundError:
            if attempt == 4 or not tmp.parent.parent.is_dir():
                raise
    raise AssertionError("unreachable")


def drop_temp_dir(output: Path) -> None:
    """Remove the output's temp folder when no writer has a file in it: a finished dataset
    holds images and metadata, nothing else."""
    with suppress(OSError):
        temp_dir(output).rmdir()


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
    except OSError as exc:
        raise unavailable(output, exc) from None
    return root


def check_space(output: Path, needed: int) -> None:
    """Refuse to start a job whose images would not fit: better to leave it queued than to
    spend GPU time on images that cannot be written."""
    try:
        stat = os.statvfs(output)
    except OSError as exc:
        raise unavailable(output, exc) from None
    free = stat.f_bavail * stat.f_frsize
    if free < needed + SPACE_RESERVE:
        raise OutputUnavailable(
            f"output folder {str(output)!r} has {free / 2**20:.1f} MiB free on this worker and the next job needs "
            f"about {(needed + SPACE_RESERVE) / 2**20:.1f} MiB: free some space",
            output=str(output),
            needed=needed,
        )


def probe_output(output: Path, needed: int) -> None:
    """Can this worker write there now? Real bytes, fsynced, so a full disk fails here (a 0-byte
    probe passes on a full disk), and enough room for the job that was given back."""
    probe = output / f".diffq-probe.{_host()}.{os.getpid()}"
    try:
        output.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as handle:
            handle.write(b"\0" * PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        raise unavailable(output, exc) from None
    finally:
        with suppress(OSError):
            probe.unlink(missing_ok=True)
    check_space(output, needed)


def remove_stale_temps(path: Path, temps: Path) -> int:
    """Delete temp files that dead writers left for ``path`` in ``temps``: a process of this
    host that is gone, or anything older than :data:`STALE_TEMP_S`. A live writer's temp file
    is left alone (it may be a stalled worker finishing the same image)."""
    removed = 0
    host = _host()
    if not temps.is_dir():
        return 0
    for stale in temps.glob(f"{path.name}.*.tmp"):
        parts = stale.name[len(path.name) + 1 : -len(".tmp")].rsplit(".", 1)
        mine = len(parts) == 2 and parts[0] == host and parts[1].isdigit()
        try:
            old = time.time() - stale.stat().st_mtime > STALE_TEMP_S
        except OSError:
            continue
        if (mine and not alive(int(parts[1]))) or old:
            stale.unlink(missing_ok=True)
            removed += 1
    return removed


@contextmanager
def locked_metadata(output: Path) -> Iterator[MetadataLog]:
    """``metadata.jsonl`` under its writers' lock (see :mod:`common.metadata_log`), so a job's
    ledger check, its lines and its ledger commit happen as one step (see :mod:`common.ledger`);
    a full, read-only or vanished disk is the worker's problem, not the job's."""
    try:
        with open_locked(output / METADATA_FILE) as log:
            yield log
    except OSError as exc:
        if exc.errno in ENVIRONMENT_ERRNOS:
            raise unavailable(output, exc) from None
        raise
