"""A sampler per job (``sampler`` column, ``--sampler``): checked at enqueue with its row, each a
diffusers scheduler and its config, switched on a warm pipeline between jobs without a reload,
recorded with each image, and in an item's key only when set (old keys unchanged)."""

from __future__ import annotations

import json

import diffusers
import numpy as np
import pytest
from conftest import TINY_FLAGS, drain, images_under, producer, write_csv

from common.errors import InvalidJobSpec
from common.jobspec import GenParams, PromptItem
from common.naming import item_key
from common.samplers import SAMPLERS
from worker.pipelines import samplers
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3, guidance=5.0)


def test_an_unknown_sampler_is_refused_with_its_row_and_the_list_and_nothing_is_enqueued(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,sampler\na fox,euler-a\na bird,dpm++\n")
    said = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out")
    assert said.exit_code == 2, said.output
    assert f"p.csv:3: unknown sampler 'dpm++'; use one of {', '.join(SAMPLERS)}" in said.output
    assert not conn.keys("rq:job:*")  # nothing half-enqueued
    said = producer("enqueue", rows, *TINY_FLAGS, "--sampler", "heun", "--timestep-spacing", "sideways")
    assert said.exit_code == 2 and "unknown timestep_spacing 'sideways'" in said.output, said.output


def test_a_sampler_is_in_an_items_key_only_when_set_so_old_keys_do_not_change():
    item = PromptItem(prompt="a lighthouse at night", seed=7)
    # this row's key as f5553bb computed it, before the sampler existed
    assert item_key(PARAMS, item) == "e69c5b67bf080a7bac427f0d"
    keys = {item_key(PARAMS.__class__(**{**PARAMS.__dict__, "sampler": name}), item) for name in SAMPLERS}
    assert len(keys) == len(SAMPLERS) and item_key(PARAMS, item) not in keys
    spaced = GenParams(**{**PARAMS.__dict__, "sampler": "euler", "timestep_spacing": "trailing"})
    assert item_key(spaced, item) not in keys


def test_each_sampler_is_its_diffusers_scheduler_and_a_warm_worker_switches_without_a_reload(cache_dir):
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    loaded, _ = cache.get("tiny")
    own = type(loaded.pipe.scheduler)
    made = {}
    for name in [None, *SAMPLERS, None]:
        params = GenParams(**{**PARAMS.__dict__, "sampler": name})
        batch = Batch(params=params, prompts=["a red fox"], negatives=[""], seeds=[3], max_batch=1)
        result, _ = cache.generate(loaded, batch)
        image = np.asarray(result.images[0], dtype=np.float32)
        assert np.isfinite(image).all() and image.std() > 0
        scheduler = loaded.pipe.scheduler
        if name is None:
            assert type(scheduler) is own  # the model's own again
        else:
            assert type(scheduler).__name__ == SAMPLERS[name].scheduler
            for option, value in SAMPLERS[name].config.items():
                assert scheduler.config[option] == value
        made.setdefault(name, image)
    assert cache.loads == 1  # every switch on the one warm pipeline
    assert len({made[name].tobytes() for name in made}) >= len(SAMPLERS) - 1  # they sample differently
    spaced = samplers.use(loaded.pipe, "euler", "trailing")
    assert spaced == "EulerDiscreteScheduler" and loaded.pipe.scheduler.config.timestep_spacing == "trailing"


def test_a_noise_sampler_on_a_flow_matching_model_is_refused_in_one_line():
    pipe = type("FluxLike", (), {})()
    pipe.scheduler = diffusers.FlowMatchEulerDiscreteScheduler()
    with pytest.raises(InvalidJobSpec, match="'dpm\\+\\+2m' predicts noise; FluxLike is a flow-matching model"):
        samplers.use(pipe, "dpm++2m", None)
    assert samplers.use(pipe, "euler", "trailing") == "FlowMatchEulerDiscreteScheduler"
    assert samplers.use(pipe, None, None) == "FlowMatchEulerDiscreteScheduler"


@pytest.mark.long  # make test runs samplers in a campaign in test_families
@pytest.mark.worker
def test_a_campaign_of_three_samplers_makes_every_image_once_with_its_sampler_and_a_rerun_adds_nothing(
    env, conn, tmp_path
):
    rows = write_csv(
        tmp_path / "p.csv",
        "prompt,sampler,timestep_spacing\na fox,euler-a,\na fox,dpm++2m-karras,\na fox,,\na bird,euler,trailing\n",
    )
    out = tmp_path / "out"
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", out).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert len(images_under(out)) == 4
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert sorted((line["sampler"] or "", line["timestep_spacing"] or "") for line in lines) == [
        ("", ""), ("dpm++2m-karras", ""), ("euler", "trailing"), ("euler-a", ""),
    ]  # fmt: skip
    again = producer("enqueue", rows, *TINY_FLAGS, "--output", out)
    assert again.exit_code == 0 and "0 new" in again.output, again.output


def test_the_unet_takes_every_samplers_timestep_as_float32_and_computes_the_same(cache_dir):
    """Euler's timesteps are float32, DPM-Solver's int64; a compiled UNet gets float32 from both
    (one graph), and the cast changes nothing the UNet computes."""
    import torch
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(cache_dir / "models" / "tiny" / "unet").eval()
    seen: list[torch.dtype] = []
    torch.manual_seed(0)
    inputs = {
        "sample": torch.randn(2, 4, 8, 8),
        "encoder_hidden_states": torch.randn(2, 77, 64),
        "added_cond_kwargs": {"text_embeds": torch.randn(2, 32), "time_ids": torch.randn(2, 6)},
    }
    with torch.no_grad():
        plain = unet(inputs["sample"], torch.tensor(981), **{k: v for k, v in inputs.items() if k != "sample"}).sample
        samplers.one_timestep_dtype(unet)
        unet.register_forward_pre_hook(lambda _m, args: seen.append(args[1].dtype))  # after the cast
        as_int = unet(inputs["sample"], torch.tensor(981), **{k: v for k, v in inputs.items() if k != "sample"}).sample
        as_float = unet(
            inputs["sample"], torch.tensor(981.0), **{k: v for k, v in inputs.items() if k != "sample"}
        ).sample
    assert seen == [torch.float32, torch.float32]
    assert torch.equal(plain, as_int) and torch.equal(as_int, as_float)


@pytest.mark.slow
@pytest.mark.long
def test_a_compiled_worker_switching_between_float_and_integer_timestep_samplers_compiles_once(cache_dir):
    """On one H200 the second sampler kind compiled the UNet again (140 s); now the first job of
    a size compiles and every sampler after it runs on the same graphs."""
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-unet")
    loaded, _ = cache.get("tiny")
    compiles = []
    for name in ("euler", "dpm++2m-karras", "unipc", "euler-a", "ddim"):
        params = GenParams(**{**PARAMS.__dict__, "sampler": name})
        batch = Batch(params=params, prompts=["a red fox"] * 2, negatives=["", ""], seeds=[3, 4], max_batch=2)
        result, _ = cache.generate(loaded, batch)
        compiles.append(result.compiles)
    assert compiles[0] > 0 and compiles[1:] == [0, 0, 0, 0], compiles
