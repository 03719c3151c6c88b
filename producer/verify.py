"""``producer verify``: does the output (a folder or a bucket) hold exactly what the ledger says?

Every done item has its image(s), each whole, and exactly one metadata line per image; every
line names an image that is there; no image or line belongs to an item the queue does not know.
``--repair`` makes it so: a line missing for an image is rebuilt from the parameters the image
carries (a PNG's ``diffq`` chunk, a JPEG's or WebP's EXIF: :mod:`common.image_format`); an
item with an image missing or broken is queued again (its lines dropped, the worker writes them
anew, and the count drops until it does); fragments and repeated lines are removed. Items still
queued or running are in flight, not problems.

It streams, for 10^7 images: one pass spills the ledger (HSCAN) and the metadata's image names
into 256 bucket files by the names' two-hex-digit folder, then each bucket is checked with its
own folder listing, so memory holds 1/256 of the dataset. It changes nothing until every
bucket is checked, and each repair step is idempotent: a repair that was stopped is finished by
running it again.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import redis
from PIL import Image

from common import image_format
from common.jobspec import GenParams, PromptItem
from common.ledger import REDO_PREFIX, done_in, is_done
from common.metadata_log import open_locked
from common.naming import IMAGES_DIR, METADATA_FILE, METADATA_PARTS_DIR, image_relpath, item_key, output_id
from common.queues import images_key, items_key
from common.reconcile import job_places, left
from common.storage import Store
from producer.metadata import metadata_files, parse, read

#: what Pillow raises for a cut or corrupt image (a truncated stream, a bad chunk, a bomb)
BROKEN_IMAGE = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)

NAME = re.compile(rf"images/([0-9a-f]{{2}})/([0-9a-f]{{24}})-(\d+)\.({'|'.join(image_format.BY_EXTENSION)})")
BUCKETS = [f"{i:02x}" for i in range(256)]
#: what each kind of problem is called in the report
KINDS = {
    "fragment": "metadata line(s) that are not a whole record",
    "repeated": "metadata line(s) repeating an image's line",
    "no_line": "image(s) of done items with no metadata line",
    "no_image": "image(s) of done items missing (or not whole) on disk",
    "lost": "done item(s) with neither image nor line: producer enqueue of their prompts file makes them again",
    "unknown": "image(s) or line(s) of items this queue's ledger does not have, or has done in another output",
    "stranded": "item(s) not done and in no runnable job (a worker died holding it, or its job was stopped or "
    "deleted): a starting worker re-queues the first kind, producer enqueue of their prompts file all of them",
    "count": "images counted as written that are not on disk",
}


@dataclass
class Problems:
    counts: Counter[str] = field(default_factory=Counter)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, example: str, n: int = 1) -> None:
        self.counts[kind] += n
        self.first.setdefault(kind, example)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Repairs:
    drop: dict[str, set[int]] = field(default_factory=dict)  # metadata file → positions of lines to remove
    lines_from_images: list[str] = field(default_factory=list)  # images whose line comes from their chunk
    delete: list[str] = field(default_factory=list)  # images that are not whole
    requeue: dict[str, tuple[str, int]] = field(default_factory=dict)  # item key → where a record of it is
    unrepairable: int = 0

    def drop_line(self, source: str, position: int) -> None:
        self.drop.setdefault(source, set()).add(position)


@dataclass
class VerifyReport:
    done_items: int = 0
    images: int = 0  # whole images of done items
    lines: int = 0
    in_flight: int = 0  # items queued or running now
    failed: int = 0  # items of failed jobs (producer retry-failed)
    other_output: int = 0  # done items of this queue written to another output
    counted: int = 0  # the ledger's images-written counter
    seconds: float = 0.0
    problems: Problems = field(default_factory=Problems)
    repairs: Repairs = field(default_factory=Repairs)
    repaired: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.problems.total == 0


def verify(
    store: Store,
    conn: redis.Redis,
    queue: str,
    *,
    deep: bool = False,
    on_bucket: Callable[[int], None] | None = None,
    ttl: float = 30.0,
) -> VerifyReport:
    """Check ``store`` against ``queue``'s ledger; plan the repairs (applied by :func:`repair`).
    Only the items done in this output are checked; items not done are in flight, failed or
    stranded by their job's place (:mod:`common.reconcile`; ``ttl`` is the heartbeat TTL)."""
    report = VerifyReport()
    started = time.perf_counter()
    report.counted = int(conn.get(images_key(queue)) or 0)
    with tempfile.TemporaryDirectory(prefix="diffq-verify-") as tmp:
        spill = Spill(Path(tmp))
        try:
            for key, place in _places(conn, queue, output_id(store.location), ttl):
                spill.write("ledger", key[:2], f"{key} {place}\n".encode())
            for line in read(store, metadata_files(store), fast=True):
                name = line.file_name
                match = NAME.fullmatch(name) if name else None
                if match is None:
                    report.problems.add("fragment", f"{line.source}: {line.text[:60]}")
                    report.repairs.drop_line(line.source, line.position)
                    continue
                report.lines += 1
                n = (line.record.get("num_images") or "") if line.record else ""
                text = f"{name}\t{line.source}\t{line.position}\t{n}\n"
                spill.write("lines", match[1], text.encode())
        finally:
            spill.close()
        _check_buckets(store, spill, report, deep, on_bucket)
    whole = report.images
    problems = report.problems.counts
    if report.counted > whole and not (problems["no_image"] or problems["lost"] or report.other_output):
        report.problems.add("count", f"{report.counted} counted, {whole} on disk", report.counted - whole)
    report.seconds = time.perf_counter() - started
    return report


#: KEYS: the items hash. ARGV: cursor, count. One HSCAN page as one string of "key state" lines:
#: a client parses one bulk string far faster than 20,000 replies
SCAN_PAGE = """
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local out = {}
for i = 1, #page[2], 2 do out[#out + 1] = page[2][i] .. ' ' .. page[2][i + 1] end
return {page[1], table.concat(out, '\\n')}
"""


def _places(conn: redis.Redis, queue: str, oid: str, ttl: float) -> Iterator[tuple[str, str]]:
    """Every item of the ledger with its place for this output: ``done`` (here), ``other``
    (done in another output), or, for items not done, their job's place (``live``, ``failed``,
    ``lost``), looked up a page at a time so memory stays flat."""
    lost = set(left(conn, queue, ttl=ttl).lost_ids)
    page: list[tuple[str, str]] = []

    def resolve() -> Iterator[tuple[str, str]]:
        places = job_places(conn, (owner for _, owner in page), lost)
        yield from ((key, places[owner]) for key, owner in page)
        page.clear()

    for key, state in _ledger(conn, items_key(queue)):
        if is_done(state):
            yield key, "done" if done_in(state) in (None, oid) else "other"
            continue
        page.append((key, state.removeprefix(REDO_PREFIX)))
        if len(page) >= 5000:
            yield from resolve()
    yield from resolve()


def _ledger(conn: redis.Redis, key: str) -> Iterator[tuple[str, str]]:
    """Every (item key, state) of the ledger, a page of HSCAN at a time."""
    page = conn.register_script(SCAN_PAGE)
    cursor = "0"
    while True:
        cursor, text = page(keys=[key], args=[cursor, 10_000])
        cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
        for line in (text.decode() if isinstance(text, bytes) else text).split("\n"):
            if line:
                item, _, state = line.partition(" ")
                yield item, state
        if cursor == "0":
            return


#: what a forked checker process needs (set before the fork, read in the child)
_CHECKING: tuple[Store, Spill, bool] | None = None


def _check_buckets(
    store: Store, spill: Spill, report: VerifyReport, deep: bool, on_bucket: Callable[[int], None] | None
) -> None:
    """Check every bucket: in one process per core (the checks are system calls and Python,
    so the GIL would serialise threads), their findings merged into ``report``."""
    global _CHECKING
    processes = min(len(os.sched_getaffinity(0)), 4)
    if processes < 2:
        for i, bucket in enumerate(BUCKETS):
            _check_bucket(store, spill, bucket, report, deep)
            if on_bucket:
                on_bucket(i + 1)
        return
    _CHECKING = (store, spill, deep)
    pool = multiprocessing.get_context("fork").Pool(processes, initializer=_default_signals)
    try:
        for i, part in enumerate(pool.imap_unordered(_bucket_in_child, BUCKETS, chunksize=4)):
            _merge(report, part)
            if on_bucket:
                on_bucket(i + 1)
        pool.close()  # the children leave on the end-of-work sentinel, no signal needed
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        _CHECKING = None


def _default_signals() -> None:
    """A forked child inherits the caller's Python signal handlers. One that returns (a warm-stop
    flag, as RQ's worker installs) made the child survive ``Pool.terminate``'s SIGTERM while it
    waited on the task queue's lock, which the parent held: ``verify`` never returned. The
    children take the default actions; the parent decides when they stop."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _bucket_in_child(bucket: str) -> VerifyReport:
    assert _CHECKING is not None
    store, spill, deep = _CHECKING
    part = VerifyReport()
    _check_bucket(store, spill, bucket, part, deep)
    return part


def _merge(report: VerifyReport, part: VerifyReport) -> None:
    report.done_items += part.done_items
    report.images += part.images
    report.in_flight += part.in_flight
    report.failed += part.failed
    report.other_output += part.other_output
    report.problems.counts.update(part.problems.counts)
    for kind, example in part.problems.first.items():
        report.problems.first.setdefault(kind, example)
    fixes, more = report.repairs, part.repairs
    for source, positions in more.drop.items():
        fixes.drop.setdefault(source, set()).update(positions)
    fixes.lines_from_images += more.lines_from_images
    fixes.delete += more.delete
    fixes.requeue.update(more.requeue)
    fixes.unrepairable += more.unrepairable


class Spill:
    """256 bucket files per kind, appended during the scan and read back one bucket at a time."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.handles: dict[tuple[str, str], Any] = {}

    def write(self, kind: str, bucket: str, data: bytes) -> None:
        handle = self.handles.get((kind, bucket))
        if handle is None:
            (self.folder / kind).mkdir(exist_ok=True)
            handle = self.handles[(kind, bucket)] = open(self.folder / kind / bucket, "ab")  # noqa: SIM115
        handle.write(data)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def lines(self, kind: str, bucket: str) -> Iterator[str]:
        path = self.folder / kind / bucket
        if path.exists():
            with open(path, encoding="utf-8") as handle:
                yield from (line.rstrip("\n") for line in handle)


def _listing(store: Store, bucket: str, deep: bool) -> dict[str, bool]:
    """The images in one bucket folder, and whether each is whole: its format's first and last
    bytes on a local folder (a PNG's signature and IEND trailer, a JPEG's end marker, a WebP's
    stated size: a cut file fails), a full decode with ``deep``; on an object store, which has
    no partial objects, a size that can hold an image."""
    folder = f"{IMAGES_DIR}/{bucket}"
    found: dict[str, bool] = {}
    if not store.remote:
        try:
            entries = list(os.scandir(store.path(folder)))
        except FileNotFoundError:
            return found
        for entry in entries:
            fmt = image_format.of_file(entry.name)
            if fmt is not None and not entry.name.startswith("."):
                found[f"{folder}/{entry.name}"] = _whole(entry.path, fmt, deep)
        return found
    base = store.path(folder)
    if not store.fs.exists(base):
        return found
    cut = len(store.root) + 1
    for path, info in store.fs.find(base, detail=True).items():
        rel = path[cut:]
        if image_format.of_file(rel) is not None:
            found[rel] = int(info.get("size") or 0) > 2 * image_format.ENDS
    if deep:
        for rel, blob in store.read_many([r for r, ok in found.items() if ok], missing_ok=True).items():
            found[rel] = _decodes(blob)
    return found


def _whole(path: str, fmt: image_format.ImageFormat, deep: bool) -> bool:
    try:
        if deep:
            with open(path, "rb") as handle:
                return _decodes(handle.read())
        fd = os.open(path, os.O_RDONLY)  # three system calls, no file object: 10^7 of them
        try:
            size = os.fstat(fd).st_size
            ends = image_format.ENDS
            return size > ends and fmt.is_whole(os.pread(fd, ends, 0), os.pread(fd, ends, size - ends), size)
        finally:
            os.close(fd)
    except OSError:
        return False


def _decodes(blob: bytes) -> bool:
    try:
        with Image.open(BytesIO(blob)) as image:
            image.load()
        return True
    except BROKEN_IMAGE:  # the finding itself: reported as a cut image
        return False


def _check_bucket(store: Store, spill: Spill, bucket: str, report: VerifyReport, deep: bool) -> None:
    ledger = dict(line.split(" ", 1) for line in spill.lines("ledger", bucket))
    files = _listing(store, bucket, deep)
    lines: dict[str, dict[int, list[tuple[str, int]]]] = {}
    extension: dict[str, str] = {}  # each item's files' (its lines', else its files')
    sizes: dict[str, int] = {}
    for text in spill.lines("lines", bucket):
        name, source, position, n = text.split("\t")
        key, index = name[10:34], int(name[35 : name.rindex(".")])
        extension.setdefault(key, name[name.rindex(".") + 1 :])
        lines.setdefault(key, {}).setdefault(index, []).append((source, int(position)))
        if n:
            sizes[key] = int(n)
    by_key: dict[str, dict[int, bool]] = {}
    for name, whole in files.items():
        match = NAME.fullmatch(name)
        if match:
            by_key.setdefault(match[2], {})[int(match[3])] = whole
            extension.setdefault(match[2], match[4])
    problems, repairs = report.problems, report.repairs
    for key in set(lines) | set(by_key) | set(ledger):
        state = ledger.get(key)
        item_lines, item_files = lines.get(key, {}), by_key.get(key, {})
        ext = extension.get(key, image_format.DEFAULT)

        def rel(index: int, key: str = key, ext: str = ext) -> str:
            return image_relpath(key, index, ext)

        example = rel(min([*item_lines, *item_files], default=0))
        if state is None or (state == "other" and (item_lines or item_files)):
            problems.add("unknown", example, len(set(item_lines) | set(item_files)))
            continue
        if state == "other":
            report.other_output += 1
            continue
        if state == "live":
            report.in_flight += 1
            continue
        if state == "failed":
            report.failed += 1
            continue
        if state == "lost":
            problems.add("stranded", f"item {key}")
            repairs.unrepairable += 1
            continue
        report.done_items += 1
        if not item_lines and not item_files:
            problems.add("lost", f"item {key}")
            repairs.unrepairable += 1
            continue
        count = sizes.get(key) or max([*item_lines, *item_files]) + 1
        missing = [i for i in range(count) if not item_files.get(i)]
        for index, places in item_lines.items():
            for source, position in places[1:]:
                problems.add("repeated", f"{source}: {key}-{index}")
                repairs.drop_line(source, position)
        if missing:  # made again whole: its lines go, the worker writes them anew
            problems.add("no_image", rel(missing[0]), len(missing))
            for index in range(count):  # every damage is listed; the remake writes these lines too
                if item_files.get(index) and index not in item_lines:
                    problems.add("no_line", rel(index))
            repairs.delete += [rel(i) for i, ok in item_files.items() if not ok]
            for places in item_lines.values():
                for source, position in places[:1]:
                    repairs.drop_line(source, position)
            if item_lines:
                repairs.requeue[key] = next(iter(item_lines.values()))[0]
            else:
                good = min(i for i, ok in item_files.items() if ok) if any(item_files.values()) else None
                if good is None:
                    repairs.unrepairable += 1
                else:
                    repairs.requeue[key] = (rel(good), -1)
            continue
        report.images += count
        for index in range(count):
            if index not in item_lines:
                problems.add("no_line", rel(index))
                repairs.lines_from_images.append(rel(index))


# -- repair -------------------------------------------------------------------------------
def chunk_record(blob: bytes) -> dict[str, Any] | None:
    """The metadata line an image was written with, as the image carries it (any format)."""
    try:
        with Image.open(BytesIO(blob)) as image:
            text = image_format.params_text(image)
    except BROKEN_IMAGE:  # no line can be rebuilt from it: the caller queues its item again
        return None
    record = parse(text) if isinstance(text, str) else None
    return record if record and isinstance(record.get("file_name"), str) else None


def _record_at(store: Store, source: str, position: int) -> dict[str, Any] | None:
    if position < 0:  # an image: its chunk
        return chunk_record(store.read(source))
    if source == METADATA_FILE:
        with store.fs.open(store.path(source), "rb") as handle:
            handle.seek(position)
            return parse(handle.readline().decode("utf-8", errors="replace"))
    text = store.read(source).decode("utf-8", errors="replace").split("\n")
    return parse(text[position]) if position < len(text) else None


def item_of(record: dict[str, Any]) -> tuple[GenParams, PromptItem] | None:
    """The params and row a record was made from, with the row's ``num_images`` found again
    (older records do not carry it: it is the one that gives the record's own key)."""
    try:
        params = GenParams.from_record(record)
        counts = [int(record["num_images"])] if record.get("num_images") else range(int(record["index"]) + 1, 65)
        for n in counts:
            item = PromptItem(
                prompt=record["prompt"],
                negative_prompt=record.get("negative_prompt") or "",
                seed=int(record["seed"]) - int(record["index"]),
                num_images=n,
                id=record.get("id"),
            )
            if item_key(params, item) == record["key"]:
                return params, item
    except (KeyError, TypeError, ValueError):
        return None
    return None


Requeue = Callable[[list[tuple[GenParams, str, PromptItem]]], int]


def repair(store: Store, report: VerifyReport, requeue: Requeue) -> None:
    """Apply ``report``'s repairs: queue again first (so a stop half-way leaves items in flight,
    not lost), then rewrite the metadata, then delete images that are not whole."""
    fixes = report.repairs
    items: list[tuple[GenParams, str, PromptItem]] = []
    for key, (source, position) in fixes.requeue.items():
        record = _record_at(store, source, position)
        found = item_of(record) if record else None
        if found is None:
            fixes.unrepairable += 1
            continue
        items.append((found[0], key, found[1]))
    queued = requeue(items) if items else 0
    if queued:
        report.repaired.append(f"{queued} item(s) queued again to remake their images")
    added = []
    for rel in fixes.lines_from_images:
        record = chunk_record(store.read(rel))
        if record is None:
            fixes.unrepairable += 1
            continue
        added.append(record)
    dropped = sum(len(p) for p in fixes.drop.values())
    if store.remote:
        _rewrite_parts(store, fixes.drop, added)
    else:
        _rewrite_file(Path(store.root), fixes.drop.get(METADATA_FILE, set()), added)
    if added:
        report.repaired.append(f"{len(added)} metadata line(s) rebuilt from their images")
    if dropped:
        report.repaired.append(f"{dropped} metadata line(s) removed")
    for rel in fixes.delete:
        store.delete(rel)
    if fixes.delete:
        report.repaired.append(f"{len(fixes.delete)} image(s) that were not whole deleted")


def _rewrite_file(output: Path, drop: set[int], added: list[dict[str, Any]]) -> None:
    """``metadata.jsonl`` without the dropped lines and with the added ones, swapped in by a
    rename under the writers' lock (a writer waiting on the old file reopens the new one)."""
    if not drop and not added:
        return
    with open_locked(output / METADATA_FILE) as meta:
        if not drop:
            meta.append(added)
            return
        tmp = output / f".{METADATA_FILE}.repair.tmp"
        with open(tmp, "wb") as out:
            offset = 0
            for raw in meta.lines_from(0):
                if offset not in drop and raw.strip():
                    out.write(raw + b"\n")
                offset += len(raw) + 1
            out.writelines(json.dumps(r, ensure_ascii=False, sort_keys=True).encode() + b"\n" for r in added)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, output / METADATA_FILE)


def _rewrite_parts(store: Store, drop: dict[str, set[int]], added: list[dict[str, Any]]) -> None:
    for part, numbers in drop.items():
        lines = store.read(part).decode("utf-8", errors="replace").split("\n")
        kept = [line for i, line in enumerate(lines) if i not in numbers and line.strip()]
        if kept:
            store.put(part, ("\n".join(kept) + "\n").encode())
        else:
            store.delete(part)
    if added:
        name = f"{METADATA_PARTS_DIR}/repair-{time.time_ns()}.jsonl"
        store.put(name, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in added).encode())


def describe(report: VerifyReport, location: str, queue: str) -> list[str]:
    rate = report.done_items / report.seconds if report.seconds else 0.0
    lines = [
        f"verified {location} against queue {queue!r}: {report.done_items} done item(s), {report.images} image(s), "
        f"{report.lines} metadata line(s), {report.in_flight} in flight; {report.seconds:.1f}s, {rate:,.0f} items/s"
    ]
    if report.failed:
        lines.append(f"  {report.failed} item(s) of failed jobs: producer status says why, producer retry-failed")
    if report.other_output:
        lines.append(f"  {report.other_output} done item(s) of this queue are in other outputs (not checked here)")
    for kind, n in report.problems.counts.most_common():
        lines.append(f"  {n} {KINDS[kind]} (first: {report.problems.first[kind]})")
    return lines
