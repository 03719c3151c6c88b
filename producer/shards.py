"""The three shard formats of ``producer export``, written deterministically.

- **webdataset**: ``NNNNNN.tar`` with ``<key>.png`` and ``<key>.json`` per sample (for a
  prompt group: ``<key>.0.png``, ``<key>.1.png``, ... and one ``<key>.json`` listing them);
  a JPEG or WebP campaign's members end in ``.jpg`` or ``.webp``, as its files do.
  Tar members have fixed owner, mode and time, so the same samples give the same bytes.
- **parquet**: ``NNNNNN.parquet``; the image column is ``struct<bytes, path>`` and the schema
  carries the Hugging Face features, so ``datasets.load_dataset("parquet", ...)`` decodes the
  images. A group is one row with list columns.
- **imagefolder**: ``NNNNNN/`` with the images and a ``metadata.jsonl`` whose ``file_name`` is
  relative to it: ``datasets.load_dataset("imagefolder", data_dir=DEST)`` reads all shards.

Images are streamed in (a batch at a time), so memory holds one batch (one Parquet row group,
at most 64 MiB of images), never a shard.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.jobspec import PARAMS
from common.storage import Store

FORMATS = ("webdataset", "parquet", "imagefolder")
#: image bytes buffered before a Parquet row group is written (memory holds at most this much)
ROW_GROUP_BYTES = 64 << 20

#: the columns every exported image carries, with their Arrow/Hugging Face types
COLUMNS: dict[str, str] = {
    "key": "string",
    "index": "int32",
    "id": "string",
    "prompt": "string",
    "negative_prompt": "string",
    "seed": "int64",
    **{name: param.export for name, param in PARAMS.items()},  # every generation parameter
    "created": "timestamp[ms]",  # UTC, naive; Parquet has no seconds unit (an imagefolder reads timestamp[s])
}


Batch = Iterator[tuple[list[dict[str, Any]], list[bytes | None]]]


#: an image's reward score ``name`` (``--score``) is the column ``score_<name>``
SCORE_PREFIX = "score_"


def score_columns(names: Iterable[str]) -> dict[str, str]:
    """The columns of the scores an export's images carry, in name order (float64 each)."""
    return {f"{SCORE_PREFIX}{name}": "float64" for name in sorted(names)}


def columns(record: dict[str, Any], kinds: dict[str, str] = COLUMNS) -> dict[str, Any]:
    """The exported columns of one image, the same values in every format. No nulls: ``datasets``
    infers a column's type from its values (an imagefolder's ``metadata.jsonl``, a WebDataset's
    JSON), and a column that is null in every row would be typed null. No adapter is ``""`` at
    scale ``0.0`` (no effect), no id is ``""``. A score column (``kinds`` beyond
    :data:`COLUMNS`) is null only for an image made while its scorer was paused: the column
    exists because other images have it, so its type is still a float."""
    scores = record.get("scores") or {}
    out = {name: scores.get(name[len(SCORE_PREFIX) :]) if name not in COLUMNS else record.get(name) for name in kinds}
    if out.get("adapter") is None:
        out["adapter"], out["adapter_scale"] = "", 0.0
    for name, kind in kinds.items():
        if out.get(name) is None and kind == "string":
            out[name] = ""
    return out


def timestamp(text: str | None) -> datetime | None:
    """``created`` (ISO 8601 with its offset) as the naive UTC time Parquet stores."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def sample_key(record: dict[str, Any]) -> str:
    """``<item key>-<index>``: no dot, so WebDataset readers split the extension correctly."""
    return f"{record['key']}-{record['index']}"


class ShardWriter:
    def __init__(self, format: str, grouped: bool, pairs: bool = False, scores: Iterable[str] = ()) -> None:
        if format not in FORMATS:
            raise ConfigError(f"--format {format!r}: use one of {', '.join(FORMATS)}")
        self.format = format
        self.grouped = grouped
        #: every column an image carries here: :data:`COLUMNS` and a ``score_<name>`` per score
        self.kinds = COLUMNS | score_columns(scores)
        self.per_image = [c for c in self.kinds if c != "prompt"]
        #: each sample a ranked pair (producer/pairs.py), one Parquet row in Pick-a-Pic's layout
        self.pairs = pairs

    def write(self, dest: Store, name: str, batches: Batch, folder: Path) -> None:
        if self.format == "webdataset":
            self._tar(dest, name, batches, folder)
        elif self.format == "parquet":
            self._parquet(dest, name, batches, folder)
        else:
            self._imagefolder(dest, name, batches)

    # -- webdataset ----------------------------------------------------------------------
    def _tar(self, dest: Store, name: str, batches: Batch, folder: Path) -> None:
        tmp = folder / f"{name}.tar"
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for sample, blobs in batches:
                present = [(r, b) for r, b in zip(sample, blobs, strict=True) if b is not None]
                if not present:
                    continue
                if not self.grouped:
                    record, blob = present[0]
                    key = sample_key(record)
                    _add(tar, f"{key}.{_ext(record)}", blob)
                    _add(tar, f"{key}.json", _json(columns(record, self.kinds)))
                    continue
                first = present[0][0]
                key = f"g{_group(first)}"
                images = []
                for i, (record, blob) in enumerate(present):
                    _add(tar, f"{key}.{i}.{_ext(record)}", blob)
                    images.append({"file": f"{i}.{_ext(record)}", **columns(record, self.kinds)})
                _add(tar, f"{key}.json", _json({"prompt": first.get("prompt"), "images": images}))
        dest.put_file(f"{name}.tar", tmp)

    # -- parquet -------------------------------------------------------------------------
    def _parquet(self, dest: Store, name: str, batches: Batch, folder: Path) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("--format parquet needs pyarrow: pip install 'diffq[parquet]'") from None
        kinds = self.kinds
        schema = _pairs_schema(pa, kinds) if self.pairs else _schema(pa, self.grouped, kinds)
        tmp = folder / f"{name}.parquet"
        pending: list[dict[str, Any]] = []
        size = 0
        with pq.ParquetWriter(tmp, schema, compression="NONE") as out:  # image bytes do not compress
            for sample, blobs in batches:
                present = [(r, b) for r, b in zip(sample, blobs, strict=True) if b is not None]
                if not present:
                    continue
                if self.pairs:
                    if len(present) < 2:
                        continue  # an image of the pair is gone: no pair (the report lists it missing)
                    rows = [_pair_row(present, self.kinds)]
                elif self.grouped:
                    row: dict[str, Any] = {
                        "group": _group(present[0][0]),
                        "prompt": present[0][0].get("prompt"),
                        "images": [{"bytes": b, "path": f"{sample_key(r)}.{_ext(r)}"} for r, b in present],
                    }
                    values = [_parquet(columns(r, self.kinds)) for r, _ in present]
                    for column in self.per_image:
                        row[column] = [v[column] for v in values]
                    rows = [row]
                else:
                    rows = [
                        {"image": {"bytes": b, "path": f"{sample_key(r)}.{_ext(r)}"}, **_parquet(columns(r, kinds))}
                        for r, b in present
                    ]
                pending += rows
                size += sum(len(b) for _, b in present)
                if size >= ROW_GROUP_BYTES:  # one row group per ~64 MiB of images: few, big groups
                    out.write_table(pa.Table.from_pylist(pending, schema=schema))
                    pending, size = [], 0
            if pending:
                out.write_table(pa.Table.from_pylist(pending, schema=schema))
        dest.put_file(f"{name}.parquet", tmp)

    # -- imagefolder ---------------------------------------------------------------------
    def _imagefolder(self, dest: Store, name: str, batches: Batch) -> None:
        lines: list[bytes] = []
        for sample, blobs in batches:
            for record, blob in zip(sample, blobs, strict=True):
                if blob is None:
                    continue
                file_name = f"{sample_key(record)}.{_ext(record)}"
                dest.put(f"{name}/{file_name}", blob)
                lines.append(_json({"file_name": file_name, **columns(record, self.kinds)}) + b"\n")
        dest.put(f"{name}/metadata.jsonl", b"".join(lines))


def _ext(record: dict[str, Any]) -> str:
    """The extension of the image a line names (png, jpg or webp): a shard's member keeps it."""
    return str(record.get("file_name", "")).rpartition(".")[2] or "png"


def _schema(pa: Any, grouped: bool, kinds: dict[str, str]) -> Any:
    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
             "timestamp[ms]": pa.timestamp("ms")}  # fmt: skip
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    if grouped:
        fields = [("group", pa.string()), ("prompt", pa.string()), ("images", pa.list_(image))]
        per_image = [c for c in kinds if c != "prompt"]
        fields += [(c, pa.list_(types[kinds[c]])) for c in per_image]
        features: dict[str, Any] = {
            "group": {"dtype": "string", "_type": "Value"},
            "prompt": {"dtype": "string", "_type": "Value"},
            "images": {"feature": {"_type": "Image"}, "_type": "List"},
        }
        for c in per_image:
            features[c] = {"feature": {"dtype": kinds[c], "_type": "Value"}, "_type": "List"}
    else:
        fields = [("image", image)] + [(c, types[t]) for c, t in kinds.items()]
        features = {"image": {"_type": "Image"}}
        features |= {c: {"dtype": t, "_type": "Value"} for c, t in kinds.items()}
    # what datasets reads to know that the struct is an image (datasets.Features.from_arrow_schema)
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema(fields, metadata=metadata)


def _pair_row(present: list[tuple[dict[str, Any], bytes]], kinds: dict[str, str]) -> dict[str, Any]:
    """A pair as Pick-a-Pic lays one out: the caption, both images, their labels and scores, and
    every column of each image with ``_0`` or ``_1``."""
    (first, a), (second, b) = present
    row: dict[str, Any] = {
        "caption": first.get("prompt"),
        "image_0": {"bytes": a, "path": f"{sample_key(first)}.{_ext(first)}"},
        "image_1": {"bytes": b, "path": f"{sample_key(second)}.{_ext(second)}"},
        "label_0": first["_label"],
        "label_1": second["_label"],
        "score_0": first["_score"],
        "score_1": second["_score"],
    }
    for i, record in enumerate((first, second)):
        for column, value in _parquet(columns(record, kinds)).items():
            row[f"{column}_{i}"] = value
    return row


def _pairs_schema(pa: Any, columns: dict[str, str]) -> Any:
    types = {"string": pa.string(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(),
             "timestamp[ms]": pa.timestamp("ms")}  # fmt: skip
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    kinds = {"caption": "string"} | dict.fromkeys(("label_0", "label_1", "score_0", "score_1"), "float64")
    kinds |= {f"{c}_{i}": t for i in (0, 1) for c, t in columns.items()}
    fields = [("caption", pa.string()), ("image_0", image), ("image_1", image)]
    fields += [(name, types[kind]) for name, kind in kinds.items() if name != "caption"]
    features: dict[str, Any] = {name: {"dtype": kind, "_type": "Value"} for name, kind in kinds.items()}
    features |= {"image_0": {"_type": "Image"}, "image_1": {"_type": "Image"}}
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    return pa.schema(fields, metadata=metadata)


def _parquet(values: dict[str, Any]) -> dict[str, Any]:
    return values | {"created": timestamp(values.get("created"))}


def group_key(prompt: str) -> str:
    """The sample key of a ``--group-by prompt`` group: a digest of the prompt text."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def _group(record: dict[str, Any]) -> str:
    return group_key(str(record.get("prompt", "")))


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))
