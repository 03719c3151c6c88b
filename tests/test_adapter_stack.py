"""Several adapters on one job (issue 77): an ``adapters`` cell or flag such as
``style.safetensors:0.8+lightning.safetensors:1``, each adapter checked as ``adapter`` is,
stored absolute and canonical, in the key only when set, merged in order at its weight on the
warm pipeline with no reload, and recorded in each image's metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_FLAGS, assert_exactly_once, drain, producer, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer
from test_adapters import make_lora

from common import adapter_stack
from common.errors import InvalidJobSpec
from common.jobspec import GenParams, PromptItem
from common.naming import item_key
from worker.pipelines.generate import run_batch
from worker.pipelines.models import DORA_TARGETS
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3)


@pytest.fixture(scope="module")
def loras(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("loras")
    model = cache_dir / "models" / "tiny"
    made = [
        make_lora(folder / name, model, DORA_TARGETS, alpha=8, metadata=True, seed=s)
        for name, s in (("a", 5), ("b", 6))
    ]
    return str(made[0]), str(made[1])


def test_a_stack_is_spelled_one_way_and_keyed_only_when_set():
    assert adapter_stack.parse("a.safetensors:0.8+ b:1") == (("a.safetensors", 0.8), ("b", 1.0))
    assert adapter_stack.parse("b") == (("b", 1.0),)
    assert adapter_stack.canonical("x:0.50+y", str.upper) == "X:0.5+Y:1"
    for bad, said in [
        ("a:0.8+", "joined by '\\+'"), ("a:0.8+a:1", "named twice"), ("a:99", "within ±10"),
        ("+".join(f"a{i}" for i in range(9)), "at most 8"),
    ]:  # fmt: skip
        with pytest.raises(InvalidJobSpec, match=said):
            adapter_stack.parse(bad)
    item = PromptItem(prompt="a fox", seed=1)
    plain = item_key(PARAMS, item)
    stacked = GenParams(**{**PARAMS.__dict__, "adapters": "/a:0.8+/b:1"})
    assert item_key(stacked, item) != plain and item_key(GenParams(**PARAMS.__dict__), item) == plain
    swapped = GenParams(**{**PARAMS.__dict__, "adapters": "/b:1+/a:0.8"})
    assert item_key(swapped, item) != item_key(stacked, item)  # DoRA merges do not commute
    with pytest.raises(InvalidJobSpec, match="adapter and adapters are both set"):
        GenParams(**{**PARAMS.__dict__, "adapter": "/a", "adapters": "/b:1"}).validate()


def test_the_producer_checks_each_adapter_of_a_stack_and_stores_them_absolute(env, conn, tmp_path, loras, monkeypatch):
    a, b = loras
    monkeypatch.chdir(Path(a).parent)
    rows = write_csv(
        tmp_path / "p.csv",
        f"prompt,adapters,adapter\na fox,a:0.5+{b},\na fox,a+{tmp_path / 'missing'}:1,\na fox,{b}:1,{a}\n",
    )
    done = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out")
    assert done.exit_code != 0 and "Traceback" not in done.output
    assert f"{rows}:3: adapter '{tmp_path / 'missing'}'" in done.output
    assert f"{rows}:4: adapter and adapters are both set" in done.output
    assert f"{rows}:2" not in done.output and conn.llen("rq:queue:diffq") == 0  # nothing half-enqueued
    both = producer("enqueue", rows, *TINY_FLAGS, "--adapter", a, "--adapters", f"{a}:1")
    assert both.exit_code != 0 and "--adapter and --adapters are both given" in both.output

    good = write_csv(tmp_path / "good.csv", f"prompt,adapters\na fox,a:0.50+{b}\n")
    assert producer("enqueue", good, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    (job_id,) = [jid.decode() for jid in conn.lrange("rq:queue:diffq", 0, -1)]
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    text = json.dumps([job.args, job.kwargs])
    assert f"{a}:0.5+{b}:1" in text  # absolute, canonical


def render(cache: WarmPipelines, stack: tuple[tuple[str, float], ...]) -> np.ndarray:
    loaded, _ = cache.get("tiny")
    cache.use_adapters(loaded, stack)
    return np.asarray(run_batch(loaded.pipe, PARAMS, ["a red fox"], [""], [7]).images[0], dtype=np.float32)


def test_a_stack_is_peft_s_weighted_adapters_merged_in_once_and_switched_without_a_reload(cache_dir, loras):
    """Two LoRAs at 0.5 and 1.0 against PEFT's own unmerged ``set_adapters`` with those weights
    (within 2/255); one adapter stacked alone is that adapter; none after a stack is the plain
    image bit for bit; each adapter is read once however often the stacks switch."""
    a, b = loras
    cache = WarmPipelines(str(cache_dir), device="cpu")
    plain = render(cache, ())
    ours = render(cache, ((a, 0.5), (b, 1.0)))
    alone = render(cache, ((a, 0.5),))
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, a, 0.5)
    single = np.asarray(run_batch(loaded.pipe, PARAMS, ["a red fox"], [""], [7]).images[0], dtype=np.float32)
    assert np.array_equal(alone, single)
    assert np.abs(render(cache, ((b, 1.0), (a, 0.5))) - ours).max() <= 1  # LoRAs add up in either order
    assert np.array_equal(render(cache, ()), plain)
    assert len(loaded.adapters) == 2 and len(loaded.merged.direct) == 2  # read once each

    reference = WarmPipelines(str(cache_dir), device="cpu")
    ref, _ = reference.get("tiny")
    ref.pipe.load_lora_weights(a, adapter_name="ra")
    ref.pipe.load_lora_weights(b, adapter_name="rb")
    ref.pipe.set_adapters(["ra", "rb"], adapter_weights=[0.5, 1.0])
    theirs = np.asarray(run_batch(ref.pipe, PARAMS, ["a red fox"], [""], [7]).images[0], dtype=np.float32)
    assert np.abs(theirs - plain).mean() > 1.0 and np.abs(theirs - alone).mean() > 1.0  # both adapters count
    assert np.abs(theirs - ours).max() <= 2.0


@pytest.mark.long  # make test: the in-process stack against PEFT's
@pytest.mark.worker
def test_a_campaign_with_a_stacked_pair_makes_every_image_once_with_its_adapters_and_a_rerun_adds_nothing(
    env, conn, tmp_path, loras
):
    a, b = loras
    rows = write_csv(tmp_path / "p.csv", f"prompt,adapters\na fox,{a}:0.5+{b}:1\na fox,tiny-dora:0.7+{a}:1\na fox,\n")
    out = tmp_path / "out"
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", out).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 3)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert sorted(line["adapters"] or "" for line in lines) == ["", f"{a}:0.5+{b}:1", f"tiny-dora:0.7+{a}:1"]
    again = producer("enqueue", rows, *TINY_FLAGS, "--output", out)
    assert again.exit_code == 0 and "0 new" in again.output, again.output
