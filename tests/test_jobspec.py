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
