"""The job spec and content-derived names: pure logic, no Redis."""

from __future__ import annotations

import json

import pytest

from common.errors import InvalidJobSpec
from common.jobspec import GenParams, JobSpec, PromptItem
from common.naming import derived_seed, image_relpath, item_key, job_id

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3)


def spec(**changes) -> dict:
    data = JobSpec(params=PARAMS, output="/tmp/out", items=(PromptItem(prompt="a cat", seed=1),)).to_dict()
    data.update(changes)
    return data


def test_spec_round_trips_through_json():
    original = JobSpec(
        params=PARAMS, output="/tmp/out", items=(PromptItem(prompt="a «cat»", seed=3, num_images=2, id="r1"),)
    )
    again = JobSpec.from_dict(json.loads(json.dumps(original.to_dict())))
    assert again == original
    assert again.num_images == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"width": 1004}, "not a multiple of 8"),
        ({"height": -64}, "outside"),
        ({"steps": 0}, "steps 0 is outside"),
        ({"guidance": float("nan")}, "finite"),
        ({"guidance": -1.0}, "outside"),
        ({"model": ""}, "model is empty"),
    ],
)
def test_bad_params_are_rejected_with_a_reason(change, message):
    data = spec()
    data["params"] = {**data["params"], **change}
    with pytest.raises(InvalidJobSpec, match=message):
        JobSpec.from_dict(data)


def test_unknown_fields_and_wrong_types_are_rejected():
    with pytest.raises(InvalidJobSpec, match="fields"):
        JobSpec.from_dict(spec(extra=1))
    data = spec()
    data["items"] = [{"prompt": "x", "seed": "1"}]
    with pytest.raises(InvalidJobSpec, match="seed must be a whole number"):
        JobSpec.from_dict(data)
    with pytest.raises(InvalidJobSpec, match="JSON object"):
        JobSpec.from_dict(["not", "a", "dict"])


def test_item_key_depends_on_everything_that_changes_pixels():
    item = PromptItem(prompt="a cat", seed=1)
    base = item_key(PARAMS, item)
    assert item_key(PARAMS, PromptItem(prompt="a cat", seed=1)) == base
    assert item_key(PARAMS, PromptItem(prompt="a cat", seed=2)) != base
    assert item_key(GenParams(model="tiny", width=64, height=64, steps=4), item) != base
    assert item_key(GenParams(model="tiny", width=64, height=64, steps=3, adapter="x"), item) != base
    assert len(base) == 24 and set(base) <= set("0123456789abcdef")


def test_derived_seed_is_stable_and_differs_per_prompt():
    assert derived_seed("a cat") == 1171083260  # the same on every run and machine (a hash, not random)
    assert derived_seed("a cat") != derived_seed("a dog")
    assert 0 <= derived_seed("a cat") < 2**32


def test_image_names_come_only_from_hex_keys():
    key = item_key(PARAMS, PromptItem(prompt="../../etc/passwd", seed=1))
    assert image_relpath(key, 0) == f"images/{key[:2]}/{key}-0.png"
    with pytest.raises(ValueError):
        image_relpath("../../etc/passwd", 0)
    assert ":" not in job_id([key], "/tmp/out", "diffq")


#: run in a copy of the code where GenParams declares one more parameter, and nothing else changed
_WITH_A_NEW_PARAMETER = r"""
import csv, json, sys
from click.testing import CliRunner
from common.jobspec import GenParams, PromptItem
from common.naming import derived_seed, item_key
from producer.cli import main
from producer.reader import RowDefaults, read_rows
from producer.shards import COLUMNS
from producer.verify import item_of

path = sys.argv[1]
with open(path, "w", newline="") as handle:
    csv.writer(handle).writerows([["prompt", "scheduler"], ["a red fox in snow", ""], ["a red fox in snow", "dpm"]])
defaults = RowDefaults(model="tiny", width=64, height=64, steps=3)
default, cell = (row.params for row in read_rows(__import__("pathlib").Path(path), defaults))
item = PromptItem(prompt="a red fox in snow", seed=derived_seed("a red fox in snow"))
record = {**cell.record(), "key": item_key(cell, item), "index": 0, "num_images": 1, "prompt": item.prompt,
          "seed": item.seed}
help_text = CliRunner().invoke(main, ["enqueue", "--help"]).output
print(json.dumps({
    "read": [default.scheduler, cell.scheduler],
    "old_key_kept": item_key(default, item) == "9d87be02447507abd550232f",
    "new_value_new_key": item_key(cell, item) != "9d87be02447507abd550232f",
    "flag": "--scheduler TEXT" in help_text and "Sampler, for rows without a scheduler cell" in help_text,
    "export": COLUMNS.get("scheduler"),
    "metadata": record.get("scheduler"),
    "rebuilt": item_of(record) == (cell, item),
    "checked": GenParams.__dataclass_fields__["scheduler"].metadata["param"].check is not None,
}))
"""


def test_a_parameter_declared_once_reaches_every_place_and_rekeys_nothing(tmp_path):
    """The declared list (common/jobspec.py:GenParams, each field with its Param) is what every
    place reads: in a copy of the code whose only change is one more field, the prompts file's
    column, the producer's flag, each image's metadata, ``producer verify``'s rebuild and the
    export schema all have it, and an item that leaves it at its default keeps its key."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("common", "producer", "worker"):
        shutil.copytree(root / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    jobspec = tmp_path / "common" / "jobspec.py"
    text = jobspec.read_text()
    anchor = "\n    def validate(self) -> GenParams:"
    assert text.count(anchor) == 1
    new_field = (
        '    scheduler: str = _param("euler", str, "string", _check_name, '
        'flag="Sampler, for rows without a scheduler cell")\n'
    )
    jobspec.write_text(text.replace(anchor, "\n" + new_field + anchor))
    run = subprocess.run([sys.executable, "-c", _WITH_A_NEW_PARAMETER, str(tmp_path / "p.csv")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen == {
        "read": ["euler", "dpm"],
        "old_key_kept": True,
        "new_value_new_key": True,
        "flag": True,
        "export": "string",
        "metadata": "dpm",
        "rebuilt": True,
        "checked": True,
    }
