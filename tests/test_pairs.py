"""Preference pairs from scored images (issue 79, part): ``producer export --by SCORE --pairs``
writes Parquet in Pick-a-Pic's layout that ``datasets`` loads, each pair two images of one prompt
whose scores differ by ``--margin`` or more (ties dropped); ``--top-k`` keeps each prompt's best
K, ``--where`` filters; the same export again writes nothing."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import datasets
import pytest
from conftest import producer
from synthetic import write_local

from producer.pairs import Where, kept, pairs

#: three prompts (image i is prompt i % 3's) of four images; prompt 2's best two tie at 6.5
SCORES = [3.0, 7.5, 5.0, 1.0, 2.0, 2.5, 9.0, 4.0, 6.5, 8.0, 6.5, 6.5]


def scored_output(out: Path) -> list[dict]:
    records = write_local(out, len(SCORES), prompts=3)
    for record, value in zip(records, SCORES, strict=True):
        record["scores"] = {"aesthetic": value, "clip": 20 + value / 10}
    (out / "metadata.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return records


def export(out: Path, to: Path, *args: str) -> str:
    done = producer("export", str(out), "--to", str(to), "--format", "parquet", *args)
    assert done.exit_code == 0, done.output
    return done.output


def test_pairs_are_every_two_images_of_a_prompt_apart_by_the_margin_and_a_tie_is_none():
    group = [{"file_name": f"{n}.png", "scores": {"s": v}} for n, v in zip("abcd", [1.0, 3.0, 3.0, 2.5], strict=True)]
    made = [(a["file_name"], b["file_name"], a["_label"]) for a, b in pairs(group, "s", 0.5)]
    assert made == [  # b and c tie: no pair; d is the margin from each
        ("a.png", "b.png", 0.0), ("a.png", "c.png", 0.0), ("a.png", "d.png", 0.0), ("b.png", "d.png", 1.0),
        ("c.png", "d.png", 1.0),
    ]  # fmt: skip
    assert [r["file_name"] for r in kept(group, "s", None, 2)] == ["b.png", "c.png"]  # the best two, in name order
    assert [r["file_name"] for r in kept(group, "s", Where.parse("s >= 2.5"), None)] == ["b.png", "c.png", "d.png"]
    assert kept(group, "s", Where.parse("steps > 1"), None) == []  # no such column in these records
    with pytest.raises(Exception, match="--where 'aesthetic'"):
        Where.parse("aesthetic")


def test_export_pairs_loads_with_datasets_and_holds_each_ranked_pair_once(env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    records = scored_output(out)
    said = export(out, tmp_path / "pairs", "--by", "aesthetic", "--pairs", "--margin", "1")
    by_prompt: dict[str, list[dict]] = {}
    for record in records:
        by_prompt.setdefault(record["prompt"], []).append(record)
    expected = {
        tuple(sorted((a["file_name"], b["file_name"])))
        for group in by_prompt.values()
        for a, b in combinations(group, 2)
        if abs(a["scores"]["aesthetic"] - b["scores"]["aesthetic"]) >= 1
    }
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "pairs" / "*.parquet"), split="train")
    assert len(ds) == len(expected) and f"as {len(expected)} sample(s)" in said
    seen = set()
    for row in ds:
        first, second = row["image_0"], row["image_1"]
        assert first.size == (16, 16) and second.size == (16, 16)
        assert row["caption"] == row["prompt_0"] == row["prompt_1"]
        assert row["label_0"] == float(row["score_0"] > row["score_1"]) and row["label_0"] + row["label_1"] == 1.0
        assert row["model_0"] == "tiny" and isinstance(row["seed_1"], int)
        seen.add(tuple(sorted((row["key_0"], row["key_1"]))))
    assert len(seen) == len(expected)
    again = export(out, tmp_path / "pairs", "--by", "aesthetic", "--pairs", "--margin", "1")
    assert "already holds this export" in again

    best = export(out, tmp_path / "best", "--by", "aesthetic", "--pairs", "--top-k", "2")
    top = datasets.load_dataset("parquet", data_files=str(tmp_path / "best" / "*.parquet"), split="train")
    assert "as 2 sample(s)" in best and len(top) == 2  # one pair of each prompt's best two, prompt 2's a tie
    export(out, tmp_path / "high", "--where", "aesthetic > 5.5")
    kept_rows = datasets.load_dataset("parquet", data_files=str(tmp_path / "high" / "*.parquet"), split="train")
    assert sorted(kept_rows["seed"]) == sorted(r["seed"] for r in records if r["scores"]["aesthetic"] > 5.5)


def test_pairs_need_a_score_and_parquet(env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    scored_output(out)
    for args, said in [
        (("--format", "parquet", "--pairs"), "name it with --by"),
        (("--format", "webdataset", "--pairs", "--by", "clip"), "use --format parquet"),
        (("--format", "parquet", "--where", "clip"), "--where 'clip'"),
    ]:
        done = producer("export", str(out), "--to", str(tmp_path / "x"), *args)
        assert done.exit_code != 0 and said in done.output and "Traceback" not in done.output, done.output


@pytest.mark.parametrize("shape", ["parquet", "imagefolder", "webdataset"])
def test_every_export_of_a_scored_output_carries_each_score_as_a_column(env, tmp_path, shape):
    """Not only pairs: each image's scores are columns ``score_<name>`` in every format, typed a
    float, null for an image whose scorer was paused (it has no score)."""
    out = tmp_path / "out"
    out.mkdir()
    records = scored_output(out)
    del records[0]["scores"]  # made while its scorer could not load
    (out / "metadata.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    to = tmp_path / shape
    done = producer("export", str(out), "--to", str(to), "--format", shape)
    assert done.exit_code == 0, done.output
    want = {r["seed"]: (r.get("scores") or {}) for r in records}
    if shape == "webdataset":
        import tarfile

        rows = []
        for shard in sorted(to.glob("*.tar")):
            with tarfile.open(shard) as tar:
                rows += [json.load(tar.extractfile(m)) for m in tar.getmembers() if m.name.endswith(".json")]
    elif shape == "parquet":
        rows = list(datasets.load_dataset("parquet", data_files=str(to / "*.parquet"), split="train"))
    else:
        rows = list(datasets.load_dataset("imagefolder", data_dir=str(to), split="train"))
    assert len(rows) == len(records)
    for row in rows:
        assert row["score_aesthetic"] == want[row["seed"]].get("aesthetic")
        assert row["score_clip"] == want[row["seed"]].get("clip")
