"""``producer export``: WebDataset, Parquet and imagefolder shards from a real run's output, read
back with the real ``webdataset`` and ``datasets`` packages; deterministic, resumable after a
kill, flat in memory, from and to a real S3-compatible server."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from conftest import ROOT, TINY_FLAGS, RedisServer, kill, producer, run_worker, s3_objects, wait_for, write_csv
from synthetic import write_local

from common.naming import METADATA_FILE
from common.storage import Store
from producer.export import MANIFEST, ExportOptions, export

#: every test here drains its queue with a real worker process
pytestmark = pytest.mark.worker

ROWS = """prompt,adapter,num_images
a red fox in snow,,1
a red fox in snow,tiny-dora,1
a lighthouse at dusk,,2
a lighthouse at dusk,tiny-dora,1
a bowl of ramen,,1
"""


@pytest.fixture(scope="module")
def made(redis_server: RedisServer, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """A real run: 5 rows, 6 images, three prompts (two of them under two adapters)."""
    out = tmp_path_factory.mktemp("made")
    env = {**os.environ, "REDIS_URL": redis_server.url, "DIFFQ_CACHE": str(cache_dir), "DIFFQ_QUEUE": "export"}
    old = os.environ.copy()
    os.environ.update(env)
    try:
        rows = write_csv(out.parent / "pairs.csv", ROWS)
        assert producer("enqueue", rows, *TINY_FLAGS, "--output", out).exit_code == 0
        assert run_worker(env).returncode == 0
    finally:
        os.environ.clear()
        os.environ.update(old)
    lines = [json.loads(line) for line in (out / METADATA_FILE).read_text().splitlines()]
    assert len(lines) == 6
    return out, {line["file_name"]: line for line in lines}


def run_export(source, dest, *args: str):
    result = producer("export", str(source), "--to", str(dest), *args)
    assert result.exit_code == 0, result.output
    return result.output


def files(folder: Path) -> dict[str, str]:
    """Every shard file's digest (markers and the manifest, which has a date, left out)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".diffq-export" not in p.parts and p.name != MANIFEST
    }


def test_webdataset_shards_read_back_with_webdataset_byte_for_byte(made, tmp_path):
    import webdataset as wds

    out, lines = made
    said = run_export(out, tmp_path / "wds", "--format", "webdataset", "--shard-size", "4")
    assert "exported 6 image(s) as 6 sample(s) in 2 shard(s)" in said
    shards = sorted((tmp_path / "wds").glob("*.tar"))
    assert [p.name for p in shards] == ["000000.tar", "000001.tar"]
    samples = list(wds.WebDataset([str(p) for p in shards], shardshuffle=False))
    assert len(samples) == 6
    for sample in samples:
        fields = json.loads(sample["json"])
        source = lines[f"images/{fields['key'][:2]}/{sample['__key__']}.png"]
        assert sample["png"] == (out / source["file_name"]).read_bytes()
        for column in ("prompt", "negative_prompt", "seed", "model", "width", "height"):
            assert fields[column] == source[column]
        assert (fields["adapter"], fields["adapter_scale"]) == (
            (source["adapter"], source["adapter_scale"]) if source["adapter"] else ("", 0.0)
        )


def test_parquet_shards_load_with_datasets(made, tmp_path):
    import datasets

    out, lines = made
    run_export(out, tmp_path / "pq", "--format", "parquet", "--shard-size", "4")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "pq" / "*.parquet"), split="train")
    assert len(ds) == 6
    assert {"image", "prompt", "seed", "adapter", "key", "steps", "guidance"} <= set(ds.column_names)
    by_seed = {(r["key"], r["index"]): r for r in ds}
    for record in lines.values():
        row = by_seed[(record["key"], record["index"])]
        assert row["prompt"] == record["prompt"] and row["seed"] == record["seed"]
        assert row["image"].size == (64, 64)  # decoded as an image, not a struct of bytes


def test_imagefolder_shards_load_with_datasets_and_no_label_column(made, tmp_path):
    import datasets

    out, _ = made
    run_export(out, tmp_path / "if", "--format", "imagefolder", "--shard-size", "4")
    assert sorted(p.name for p in (tmp_path / "if").iterdir()) == ["000000", "000001", MANIFEST]
    ds = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "if"), split="train")
    assert len(ds) == 6 and "label" not in ds.column_names
    assert {"prompt", "adapter", "seed"} <= set(ds.column_names)


def test_group_by_prompt_puts_every_image_of_a_prompt_in_one_sample(made, tmp_path):
    import datasets
    import webdataset as wds

    out, _ = made
    said = run_export(out, tmp_path / "g", "--format", "webdataset", "--group-by", "prompt")
    assert "as 3 sample(s)" in said
    groups = {}
    for sample in wds.WebDataset(str(tmp_path / "g" / "000000.tar"), shardshuffle=False):
        meta = json.loads(sample["json"])
        assert sorted(k for k in sample if k.endswith("png")) == sorted(i["file"] for i in meta["images"])
        groups[meta["prompt"]] = meta["images"]
    fox = groups["a red fox in snow"]
    assert sorted(i["adapter"] for i in fox) == ["", "tiny-dora"]  # two rows, two adapters, one group
    assert len(groups["a lighthouse at dusk"]) == 3 and len(groups["a bowl of ramen"]) == 1

    run_export(out, tmp_path / "gp", "--format", "parquet", "--group-by", "prompt")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "gp" / "*.parquet"), split="train")
    row = next(r for r in ds if r["prompt"] == "a lighthouse at dusk")
    assert len(row["images"]) == 3 and row["images"][0].size == (64, 64)
    assert sorted(row["adapter"]) == ["", "", "tiny-dora"]  # one image's column names, as lists
    # a preference pair: the same prompt and seed under two adapters, and a second seed
    seed = min(row["seed"])
    assert sorted(zip(row["seed"], row["adapter"], strict=True)) == [(seed, ""), (seed, "tiny-dora"), (seed + 1, "")]
    assert not [c for c in ds.column_names if c.endswith("s") and c not in ("images", "steps", "adapters")]


def test_the_same_output_gives_the_same_shards(made, tmp_path):
    out, _ = made
    for fmt in ("webdataset", "parquet"):
        run_export(out, tmp_path / f"a-{fmt}", "--format", fmt, "--shard-size", "4")
        run_export(out, tmp_path / f"b-{fmt}", "--format", fmt, "--shard-size", "4")
        assert files(tmp_path / f"a-{fmt}") == files(tmp_path / f"b-{fmt}")


def test_user_errors_are_one_line(made, tmp_path):
    out, _ = made
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, says in [
        ((str(empty), "--format", "webdataset"), "has no metadata"),
        ((str(tmp_path / "nope"), "--format", "webdataset"), "no such folder"),
        ((str(out), "--format", "imagefolder", "--group-by", "prompt"), "--group-by prompt needs --format"),
    ]:
        result = producer("export", *args, "--to", str(tmp_path / "dest"))
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines()[-1].startswith("error: ") and says in result.output
        assert "Traceback" not in result.output


@pytest.mark.slow
def test_a_killed_export_run_again_writes_only_the_missing_shards(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    write_local(source, 4000)
    dest = tmp_path / "dest"
    cmd = [sys.executable, "-m", "producer", "export", str(source), "--to", str(dest), "--format", "webdataset",
           "--shard-size", "25"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        markers = dest / ".diffq-export"
        wait_for(lambda: markers.is_dir() and len(list(markers.glob("*.json"))) >= 3, 120, "three shards", 0.01)
    finally:
        kill(proc)
    finished = len(list((dest / ".diffq-export").glob("*.json")))
    print(f"killed after {finished} of 160 shards")
    assert finished < 160, "the export finished before it could be killed: make the source bigger"
    said = run_export(source, dest, "--format", "webdataset", "--shard-size", "25")
    assert f"({160 - finished} written, {finished} already there)" in said, said
    run_export(source, tmp_path / "fresh", "--format", "webdataset", "--shard-size", "25")
    assert files(dest) == files(tmp_path / "fresh")  # resumed shards are the shards a clean run writes


def _export_peak(tmp_path: Path, n: int) -> int:
    source = tmp_path / f"src{n}"
    source.mkdir()
    write_local(source, n)
    options = ExportOptions(format="webdataset", shard_size=100, sort_buffer=500)
    tracemalloc.start()
    report = export(Store(str(source)), Store(str(tmp_path / f"dest{n}")), options)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert report.images == n
    return peak


@pytest.mark.long  # a scale check; make test exports, resumes and reads back every format
@pytest.mark.slow
def test_export_streams_memory_does_not_grow_with_the_dataset(tmp_path):
    small = _export_peak(tmp_path, 1_000)
    large = _export_peak(tmp_path, 5_000)
    assert large < 1.5 * small, (small, large)


def test_from_s3_parts_to_s3_shards_with_a_repeated_line_merged(tmp_path, s3_server, bucket):
    """An object-store output: images and per-job metadata parts, one line repeated in a second
    part (an execution that lost its job and was killed before withdrawing its part)."""
    local = tmp_path / "src"
    local.mkdir()
    records = write_local(local, 10)
    s3 = s3_server.client()
    for rec in records:
        s3.put_object(Bucket=bucket, Key=f"out/{rec['file_name']}", Body=(local / rec["file_name"]).read_bytes())
    lines = [json.dumps(r) + "\n" for r in records]
    s3.put_object(Bucket=bucket, Key="out/metadata/dqa.111.jsonl", Body="".join(lines[:6]).encode())
    s3.put_object(Bucket=bucket, Key="out/metadata/dqb.222.jsonl", Body="".join(lines[5:]).encode())

    said = run_export(f"s3://{bucket}/out", f"s3://{bucket}/shards", "--format", "webdataset", "--shard-size", "4")
    assert "exported 10 image(s)" in said and "1 repeated metadata line(s) merged" in said
    shards = s3_objects(s3_server, bucket, "shards/")
    assert sorted(k for k in shards if k.endswith(".tar")) == [f"shards/00000{i}.tar" for i in range(3)]
    (tmp_path / "from-s3").mkdir()
    run_export(f"s3://{bucket}/out", tmp_path / "from-s3", "--format", "webdataset", "--shard-size", "4")
    for i in range(3):  # S3 → S3 and S3 → local give the same bytes
        assert shards[f"shards/00000{i}.tar"] == (tmp_path / "from-s3" / f"00000{i}.tar").read_bytes()
    run_export(local, tmp_path / "from-local", "--format", "webdataset", "--shard-size", "4")
    assert files(tmp_path / "from-local") == files(tmp_path / "from-s3")  # and so does the same data on disk


def test_a_new_export_never_mixes_with_what_the_destination_held(made, tmp_path):
    import webdataset as wds

    out, _ = made
    dest = tmp_path / "wds"
    first = run_export(out, dest, "--format", "webdataset", "--shard-size", "2")
    assert 'read it with webdataset.WebDataset("' + str(dest) + '/{000000..000002}.tar")' in first
    refused = producer("export", str(out), "--to", str(dest), "--format", "webdataset")
    assert refused.exit_code == 2, refused.output
    assert "holds another export (6 sample(s) in 3 webdataset shard(s) of 2)" in refused.output
    assert "--overwrite" in refused.output and len(list(dest.glob("*.tar"))) == 3  # untouched
    again = run_export(out, dest, "--format", "webdataset", "--overwrite")
    assert "2 file(s) that were there before removed" in again, again
    assert sorted(p.name for p in dest.iterdir()) == ["000000.tar", MANIFEST]  # no stale shard, no marker
    assert len(list(wds.WebDataset(str(dest / "000000.tar"), shardshuffle=False))) == 6
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["samples"] == 6 and manifest["shards"] == 1 and manifest["images"] == 6
    assert manifest["read_with"] == f'webdataset.WebDataset("{dest}/000000.tar")'

    before = files(dest)
    same = run_export(out, dest, "--format", "webdataset")  # the same export: nothing to do
    assert "already holds this export" in same and "nothing written" in same
    assert files(dest) == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    foreign = producer("export", str(out), "--to", str(other), "--format", "parquet")
    assert foreign.exit_code == 2 and "is not empty (it holds notes.txt" in foreign.output
    assert (other / "notes.txt").read_text() == "mine"


def test_every_column_has_one_type_in_every_format(made, tmp_path):
    import datasets

    out, _ = made
    run_export(out, tmp_path / "pq", "--format", "parquet")
    run_export(out, tmp_path / "if", "--format", "imagefolder")
    run_export(out, tmp_path / "wds", "--format", "webdataset")
    parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "pq" / "*.parquet"), split="train")
    folder = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "if"), split="train")
    web = datasets.load_dataset("webdataset", data_files=str(tmp_path / "wds" / "*.tar"), split="train")
    expected = {"key": "string", "index": "int32", "id": "string", "adapter": "string", "adapter_scale": "float64",
                "created": "timestamp[ms]", "seed": "int64"}  # fmt: skip
    for name, kind in expected.items():
        assert parquet.features[name].dtype == kind, name
        if kind.startswith("int"):  # JSON has one integer type
            assert folder.features[name].dtype == "int64" and web.features["json"][name].dtype == "int64", name
        elif kind.startswith("timestamp"):  # JSON has no time type: ISO 8601 text, imagefolder reads it as one
            assert folder.features[name].dtype == "timestamp[s]" and web.features["json"][name].dtype == "string"
        else:
            assert folder.features[name].dtype == kind and web.features["json"][name].dtype == kind, name
    by_key = {(r["key"], r["index"]): r["created"] for r in folder}
    assert all(by_key[(r["key"], r["index"])] == r["created"] for r in parquet)  # the same instants
