"""``producer export``: turn an output (folder or bucket) into dataset shards.

The steps, each with memory that does not grow with the dataset:

1. **Merge** the metadata: ``metadata.jsonl`` (a local output) and the per-job parts under
   ``metadata/`` (an object-store output), read as a stream.
2. **Sort** it by ``file_name`` (or by prompt, then ``file_name``, for ``--group-by prompt``)
   with an external merge sort: runs of ``sort_buffer`` lines are sorted in memory and spilled
   to temp files, then merged. Sorting makes the shards deterministic (the same output gives
   the same shards, byte for byte) and puts duplicate lines side by side, where one line per
   image is kept (see :mod:`worker.output.objects` for how a part can repeat a line).
3. **Write** shards of ``shard_size`` samples, reading images 64 at a time (concurrent GETs
   on an object store). Each shard is finished in a local temp file and put under its final
   name in one step, then a marker ``.diffq-export/NNNNNN.json`` records the digest of its
   lines. A run that was killed and started again skips every shard whose marker matches and
   writes only the rest.
4. **Seal**: whatever the destination holds that this export did not write is removed (shards
   of an earlier export with another shard size), the markers go, and ``diffq-export.json`` is
   written last: the manifest (samples, shards, the pattern to read them, the metadata and
   ledger state they came from). Its presence means the export is whole.

A destination is written only when it is empty, holds an unfinished export (markers, no
manifest), or ``--overwrite`` says so: an export never mixes with what was there. The same
export again (same metadata, same options) finds its manifest and writes nothing.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.errors import ConfigError, DiffqError
from common.naming import METADATA_FILE, METADATA_PARTS_DIR
from common.storage import Store, problem
from producer.metadata import metadata_files, read
from producer.pairs import Where, kept, pairs
from producer.shards import FORMATS, ShardWriter, group_key

#: lines sorted in memory before a run is spilled to disk (about 60 MB of metadata)
SORT_BUFFER = 100_000
#: images read per request batch (concurrent GETs on an object store)
READ_BATCH = 64
MARKERS_DIR = ".diffq-export"
MANIFEST = "diffq-export.json"
EXTENSIONS = {"webdataset": ".tar", "parquet": ".parquet", "imagefolder": ""}


class ExportError(DiffqError):
    """The source has no metadata, or a destination cannot be written."""

    exit_code = 2


@dataclass(frozen=True, kw_only=True)
class ExportOptions:
    format: str
    shard_size: int = 1000
    group_by: str | None = None
    sort_buffer: int = SORT_BUFFER
    #: the score that ranks a prompt's images (``--by``): for ``--pairs`` and ``--top-k``
    by: str | None = None
    #: one sample per ranked pair of a prompt's images (producer/pairs.py)
    pairs: bool = False
    #: the least difference of scores that makes a pair
    margin: float = 0.0
    #: the best K images of each prompt, by ``by``
    top_k: int | None = None
    where: str | None = None

    @property
    def by_prompt(self) -> bool:
        """Whether the lines are sorted by prompt: to group them, or to rank each prompt's images."""
        return bool(self.group_by or self.pairs or self.top_k)

    def ranking(self) -> str:
        """What ``--by``, ``--pairs``, ``--margin``, ``--top-k`` and ``--where`` decide, for the
        digests ("" without them: an export made before they existed keeps its digests)."""
        if not (self.by or self.pairs or self.top_k or self.where):
            return ""
        return f"{self.by}|{self.pairs}|{self.margin!r}|{self.top_k}|{self.where}|"

    def validate(self) -> ExportOptions:
        if self.format not in FORMATS:
            raise ConfigError(f"--format {self.format!r}: use one of {', '.join(FORMATS)}")
        if self.shard_size < 1:
            raise ConfigError(f"--shard-size {self.shard_size}: use at least 1")
        if self.group_by not in (None, "prompt"):
            raise ConfigError(f"--group-by {self.group_by!r}: only 'prompt' is supported")
        if self.group_by and self.format == "imagefolder":
            raise ConfigError(
                "--group-by prompt needs --format webdataset or parquet: imagefolder has one row per image "
                "(group its rows by their prompt column instead)"
            )
        if self.sort_buffer < 100:
            raise ConfigError(f"--sort-buffer {self.sort_buffer}: use at least 100")
        if (self.pairs or self.top_k is not None) and not self.by:
            raise ConfigError("--pairs and --top-k rank a prompt's images by a score: name it with --by (--by clip)")
        if self.pairs and (self.format != "parquet" or self.group_by):
            raise ConfigError("--pairs writes Parquet pairs (Pick-a-Pic's layout): use --format parquet, no --group-by")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k {self.top_k}: keep at least 1")
        if self.margin < 0:
            raise ConfigError(f"--margin {self.margin:g}: use 0 or more")
        if self.where:
            Where.parse(self.where)
        return self


@dataclass
class ExportReport:
    lines: int = 0  # metadata lines read
    duplicates: int = 0  # lines for an image that already had one (dropped)
    images: int = 0  # images in the shards
    samples: int = 0  # samples (images, or prompt groups)
    shards: int = 0
    written: int = 0  # shards written by this run
    kept: int = 0  # shards a previous run had finished
    missing: list[str] = field(default_factory=list)  # lines whose image is gone
    removed: int = 0  # files of an earlier export (or anything else) this one replaced
    up_to_date: bool = False  # the destination held this very export already
    pattern: str = ""  # how to read the shards
    ledger: dict[str, Any] = field(default_factory=dict)  # the queue's counts, when a queue was named
    ranked: bool = False  # --where, --top-k or --pairs chose the samples: not every image is in them
    seconds: float = 0.0


# -- 2. sort -------------------------------------------------------------------------------
class ExternalSort:
    """Sort ``(key, line)`` pairs with bounded memory: sorted runs spilled to ``folder``, then
    a k-way merge. A line never contains a tab or a newline (JSON escapes them)."""

    def __init__(self, folder: Path, buffer: int) -> None:
        self.folder = folder
        self.buffer = buffer
        self.pending: list[str] = []
        self.runs: list[Path] = []

    def add(self, key: str, line: str) -> None:
        self.pending.append(f"{key}\t{line}")
        if len(self.pending) >= self.buffer:
            self._spill()

    def _spill(self) -> None:
        self.pending.sort()
        run = self.folder / f"run{len(self.runs):05d}.txt"
        with open(run, "w", encoding="utf-8") as out:
            out.writelines(entry + "\n" for entry in self.pending)
        self.runs.append(run)
        self.pending = []

    def merged(self) -> Iterator[tuple[str, str]]:
        if not self.runs:
            self.pending.sort()
            streams: list[Iterator[str]] = [iter(self.pending)]
        else:
            if self.pending:
                self._spill()
            streams = [(line.rstrip("\n") for line in open(run, encoding="utf-8")) for run in self.runs]  # noqa: SIM115
        for entry in heapq.merge(*streams):
            key, line = entry.split("\t", 1)
            yield key, line


def sorted_records(store: Store, options: ExportOptions, folder: Path, report: ExportReport) -> Path:
    """Merge, sort and dedup the metadata into one file of lines (one per image, in shard order);
    return its path."""
    sorter = ExternalSort(folder, options.sort_buffer)
    for line in read(store, metadata_files(store)):  # each line parsed once, there
        record = line.record
        if record is None:
            continue  # a torn last line (a writer killed mid-append) is not a record
        name = record.get("file_name") or record.get("file")
        if not isinstance(name, str):
            continue
        report.lines += 1
        key = f"{group_key(str(record.get('prompt', '')))} {name}" if options.by_prompt else name
        sorter.add(key, json.dumps(record, ensure_ascii=False, sort_keys=True))
    merged = folder / "merged.jsonl"
    last_name = None
    with open(merged, "w", encoding="utf-8") as out:
        for key, line in sorter.merged():
            name = key.rsplit(" ", 1)[-1]
            if name == last_name:
                report.duplicates += 1
                continue
            last_name = name
            out.write(line + "\n")
    for run in sorter.runs:
        run.unlink()
    return merged


def samples(merged: Path, grouped: bool) -> Iterator[list[dict[str, Any]]]:
    """One list per sample: one record, or every record of one prompt."""
    group: list[dict[str, Any]] = []
    current = None
    with open(merged, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if not grouped:
                yield [record]
                continue
            key = group_key(str(record.get("prompt", "")))
            if group and key != current:
                yield group
                group = []
            current = key
            group.append(record)
    if group:
        yield group


def export_samples(merged: Path, options: ExportOptions) -> Iterator[list[dict[str, Any]]]:
    """The samples the shards hold: images, prompt groups, or ranked pairs, after ``--where`` and ``--top-k``."""
    if not options.by_prompt and not options.where:
        yield from samples(merged, False)
        return
    where = Where.parse(options.where) if options.where else None
    for group in samples(merged, options.by_prompt):
        chosen = kept(group, options.by, where, options.top_k)
        if options.pairs:
            assert options.by is not None
            yield from pairs(chosen, options.by, options.margin)
        elif options.group_by:
            if chosen:
                yield chosen
        else:
            yield from ([record] for record in chosen)


def count_samples(merged: Path, options: ExportOptions) -> tuple[int, int, set[str]]:
    """(samples, images, score names) in the merged file, one cheap pass (for the progress bar's
    total, and the score columns every shard then carries, whichever images it holds)."""
    n_samples = n_images = 0
    names: set[str] = set()
    for sample in export_samples(merged, options):
        n_samples += 1
        n_images += len(sample)
        for record in sample:
            names.update(record.get("scores") or ())
    return n_samples, n_images, names


# -- 3. write ------------------------------------------------------------------------------
def shard_digest(options: ExportOptions, shard: list[list[dict[str, Any]]]) -> str:
    h = hashlib.sha256(f"{options.format}|{options.group_by}|{options.ranking()}".encode())
    for sample in shard:
        for record in sample:
            h.update(json.dumps(record, ensure_ascii=False, sort_keys=True).encode("utf-8"))
            h.update(b"\n")
        h.update(b"\x1e")
    return h.hexdigest()


def _storage_error(exc: BaseException, store: Store, role: str) -> DiffqError | None:
    line = problem(exc, store.location, store.endpoint_url)
    if line is None:
        return None
    return ExportError(f"{role} {line.removeprefix('output ')}")


def _destination(dest: Store) -> tuple[str, dict[str, Any] | None, str]:
    """What ``dest`` holds: ``empty``, ``unfinished`` (an export's markers, no manifest),
    ``export`` (a whole export: its manifest) or ``other``; the manifest; one file there."""
    try:
        if dest.exists(MANIFEST):
            return "export", json.loads(dest.read(MANIFEST)), MANIFEST
        first = next(iter(dest.listing("")), None)
        if first is None:
            return "empty", None, ""
        return ("unfinished" if dest.exists(MARKERS_DIR) else "other"), None, first
    except Exception as exc:
        err = _storage_error(exc, dest, "destination")
        if err is None:
            raise
        raise err from None


def pattern(dest: Store, options: ExportOptions, shards: int) -> str:
    """How to read exactly these shards, as a user would type it."""
    where = dest.location.rstrip("/")
    if options.format == "imagefolder":
        return f'datasets.load_dataset("imagefolder", data_dir="{where}")'
    if options.format == "parquet":
        return f'datasets.load_dataset("parquet", data_files="{where}/*.parquet")'
    names = "000000" if shards == 1 else f"{{000000..{shards - 1:06d}}}"
    return f'webdataset.WebDataset("{where}/{names}.tar")'


def _digest_file(path: Path, options: ExportOptions) -> str:
    digest = hashlib.sha256(f"{options.format}|{options.shard_size}|{options.group_by}|{options.ranking()}".encode())
    with open(path, "rb") as handle:
        while block := handle.read(64 << 10):
            digest.update(block)
    return digest.hexdigest()


def export(
    source: Store,
    dest: Store,
    options: ExportOptions,
    on_start: Callable[[int], None] | None = None,
    on_sample: Callable[[int], None] | None = None,
    *,
    overwrite: bool = False,
    ledger: dict[str, Any] | None = None,
) -> ExportReport:
    """Export ``source`` to shards under ``dest``; see the module docstring. ``ledger``: the
    queue's counts, recorded in the manifest."""
    options.validate()
    report = ExportReport(ledger=ledger or {}, ranked=bool(options.ranking()))
    started = time.perf_counter()
    held, manifest, example = _destination(dest)
    if held == "other" and not overwrite:
        raise ExportError(
            f"destination {dest.location!r} is not empty (it holds {example}, not written by an export): "
            "add --overwrite to replace what is there with this export, or choose another --to"
        )
    with tempfile.TemporaryDirectory(prefix="diffq-export-") as tmp:
        folder = Path(tmp)
        try:
            merged = sorted_records(source, options, folder, report)
        except Exception as exc:
            err = _storage_error(exc, source, "source")
            if err is None:
                raise
            raise err from None
        if report.lines == 0:
            raise ExportError(
                f"source {source.location!r} has no metadata ({METADATA_FILE} or {METADATA_PARTS_DIR}/*.jsonl): "
                "is it a diffq output?"
            )
        report.samples, report.images, scores = count_samples(merged, options)
        report.shards = -(-report.samples // options.shard_size)
        report.pattern = pattern(dest, options, report.shards)
        export_id = _digest_file(merged, options)
        if manifest is not None and manifest.get("export_id") == export_id:
            report.kept, report.up_to_date = report.shards, True
            report.seconds = time.perf_counter() - started
            return report
        if manifest is not None and not overwrite:
            raise ExportError(
                f"destination {dest.location!r} holds another export ({manifest.get('samples')} sample(s) in "
                f"{manifest.get('shards')} {manifest.get('format')} shard(s) of {manifest.get('shard_size')}): "
                "add --overwrite to replace it, or choose another --to"
            )
        if manifest is not None:
            dest.delete(MANIFEST)  # from here on, an unfinished export
        if on_start:
            on_start(report.samples)
        writer = ShardWriter(options.format, grouped=bool(options.group_by), pairs=options.pairs, scores=scores)
        shard: list[list[dict[str, Any]]] = []
        index = 0
        for sample in export_samples(merged, options):
            shard.append(sample)
            if len(shard) == options.shard_size:
                _write_shard(source, dest, writer, options, index, shard, folder, report)
                if on_sample:
                    on_sample(len(shard))
                shard, index = [], index + 1
        if shard:
            _write_shard(source, dest, writer, options, index, shard, folder, report)
            if on_sample:
                on_sample(len(shard))
        _seal(dest, options, report, export_id)
    report.seconds = time.perf_counter() - started
    return report


def _seal(dest: Store, options: ExportOptions, report: ExportReport, export_id: str) -> None:
    """Remove what this export did not write, the markers, and write the manifest last."""
    ours = {f"{i:06d}{EXTENSIONS[options.format]}" for i in range(report.shards)}
    try:
        for rel in list(dest.listing("")):
            top = rel.split("/", 1)[0]
            if top not in ours and top != MARKERS_DIR:
                dest.delete(rel)
                report.removed += 1
        dest.remove_tree(MARKERS_DIR)
        body = {
            "format": options.format,
            "shard_size": options.shard_size,
            "group_by": options.group_by,
            "samples": report.samples,
            "images": report.images,
            "shards": report.shards,
            "read_with": report.pattern,
            "export_id": export_id,  # the sorted metadata and the options: the same id, the same shards
            "metadata_lines": report.lines,
            "repeated_lines": report.duplicates,
            "missing_images": len(report.missing),
            "ledger": report.ledger,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        dest.put(MANIFEST, json.dumps(body, indent=2, sort_keys=True).encode() + b"\n")
    except Exception as exc:
        err = _storage_error(exc, dest, "destination")
        if err is None:
            raise
        raise err from None


def _write_shard(
    source: Store,
    dest: Store,
    writer: ShardWriter,
    options: ExportOptions,
    index: int,
    shard: list[list[dict[str, Any]]],
    folder: Path,
    report: ExportReport,
) -> None:
    name = f"{index:06d}"
    marker = f"{MARKERS_DIR}/{name}.json"
    digest = shard_digest(options, shard)
    try:
        if dest.exists(marker) and json.loads(dest.read(marker)).get("digest") == digest:
            report.kept += 1
            return
    except Exception as exc:
        err = _storage_error(exc, dest, "destination")
        if err is None:
            raise
        raise err from None

    def images() -> Iterator[tuple[list[dict[str, Any]], list[bytes | None]]]:
        batch: list[list[dict[str, Any]]] = []
        for sample in shard:
            batch.append(sample)
            if sum(len(s) for s in batch) >= READ_BATCH:
                yield from _read_batch(source, batch, report)
                batch = []
        if batch:
            yield from _read_batch(source, batch, report)

    try:
        if options.format == "imagefolder":
            dest.remove_tree(name)  # a shard folder holds this shard's files only
        writer.write(dest, name, images(), folder)
        dest.put(marker, json.dumps({"digest": digest, "samples": len(shard)}).encode())
    except DiffqError:
        raise
    except Exception as exc:
        err = _storage_error(exc, dest, "destination")
        if err is None:
            raise
        raise err from None
    report.written += 1


def _read_batch(
    source: Store, batch: list[list[dict[str, Any]]], report: ExportReport
) -> Iterator[tuple[list[dict[str, Any]], list[bytes | None]]]:
    names = [record["file_name"] for sample in batch for record in sample]
    try:
        got = source.read_many(names, missing_ok=True)
    except Exception as exc:
        err = _storage_error(exc, source, "source")
        if err is None:
            raise
        raise err from None
    for sample in batch:
        blobs = [got.get(record["file_name"]) for record in sample]
        report.missing += [r["file_name"] for r, b in zip(sample, blobs, strict=True) if b is None]
        yield sample, blobs


def describe(report: ExportReport, dest: str) -> str:
    rate = report.images / report.seconds if report.seconds else 0.0
    if report.up_to_date:
        return (
            f"{dest} already holds this export ({report.images} image(s), {report.samples} sample(s) in "
            f"{report.shards} shard(s)): nothing written; read it with {report.pattern}"
        )
    text = (
        f"exported {report.images} image(s) as {report.samples} sample(s) in {report.shards} shard(s) to {dest} "
        f"({report.written} written, {report.kept} already there) in {report.seconds:.1f}s, {rate:.0f} images/s"
    )
    if report.duplicates:
        text += f"; {report.duplicates} repeated metadata line(s) merged"
    if report.removed:
        text += f"; {report.removed} file(s) that were there before removed"
    if report.missing:
        text += (
            f"; {len(report.missing)} image(s) listed in the metadata are missing and were left out "
            f"(first: {report.missing[0]}); producer verify --repair makes them again"
        )
    written = report.ledger.get("images_written")
    if written is not None and written != report.images and not report.ranked:
        text += (
            f"; the ledger counts {written} image(s) written, this export has {report.images}: "
            "producer verify finds the difference"
        )
    return f"{text}\nread it with {report.pattern}"
