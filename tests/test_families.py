"""Model families (issue 77): SDXL, FLUX, SD3 and PixArt each one module behind one registry, any
other text-to-image pipeline of diffusers run eagerly by the generic family, and a folder whose
pipeline no family runs refused at enqueue.

The tiny presets of SD3 and PixArt are written to disk by the real code and loaded with
``from_pretrained``, as ``tiny`` is; the generic family's model is a tiny Stable Diffusion 1.5
folder this test writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_exactly_once, drain, producer, write_csv

from common.errors import InvalidJobSpec, ModelLoadError
from common.families import NEEDS_AN_IMAGE, TEXT_TO_IMAGE
from common.jobspec import GenParams
from worker.pipelines import families, models
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines

SIZE = {"width": 64, "height": 64, "steps": 3}


def test_the_pipelines_diffq_runs_are_diffusers_text_to_image_ones_less_those_needing_an_image():
    from diffusers.pipelines.auto_pipeline import AUTO_TEXT2IMAGE_PIPELINES_MAPPING

    theirs = {cls.__name__ for cls in AUTO_TEXT2IMAGE_PIPELINES_MAPPING.values()}
    assert {name for name in theirs if not any(word in name for word in NEEDS_AN_IMAGE)} == TEXT_TO_IMAGE
    for family in families.FAMILIES[:-1]:  # every named family's pipelines are among them
        assert set(family.pipelines) - {"xFuserFluxPipeline"} <= TEXT_TO_IMAGE, family.title


def generate(cache: WarmPipelines, model: str, prompts: list[str], seeds: list[int], **params: object) -> list:
    loaded, _ = cache.get(model)
    steps: list[tuple[int, int]] = []
    batch = Batch(
        params=GenParams(model=model, **{**SIZE, "guidance": 5.0, **params}),
        prompts=prompts,
        negatives=["blurry"] + [""] * (len(prompts) - 1),
        seeds=seeds,
        max_batch=len(prompts),
    )
    result, _ = cache.generate(loaded, batch, on_step=lambda step, total: steps.append((step, total)))
    assert steps[-1] == (SIZE["steps"], SIZE["steps"])  # progress from every family's pipeline
    return [np.asarray(image, dtype=np.int16) for image in result.images]


@pytest.mark.parametrize(
    "model, title, pipeline, sampler",
    [
        ("tiny", "SDXL", "StableDiffusionXLPipeline", "dpm++2m-karras"),
        ("tiny-sd3", "SD3", "StableDiffusion3Pipeline", "euler"),
        ("tiny-pixart", "PixArt", "PixArtSigmaPipeline", "unipc"),
    ],
)
def test_each_family_makes_each_image_from_its_own_seed_with_the_jobs_sampler(
    cache_dir, model, title, pipeline, sampler
):
    """A family's batch: one image per row at the size asked, each a function of its own row
    (the same seed alone or among others gives the same pixels), other seeds other images, the
    job's sampler on the warm pipeline."""
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    together = generate(cache, model, ["a red fox", "a blue bird", "a cat"], [7, 8, 9], sampler=sampler)
    alone = generate(cache, model, ["a red fox"], [7], sampler=sampler)
    loaded, _ = cache.get(model)
    assert type(loaded.pipe).__name__ == pipeline and families.family_of(loaded.pipe).title == title
    assert [image.shape for image in together] == [(64, 64, 3)] * 3
    # a batch's kernels may round one 8-bit level apart from a lone image's (PixArt: 1 value in 12,288)
    assert np.abs(together[0] - alone[0]).max() <= 1
    assert not np.array_equal(together[1], together[2]) and all(image.std() > 0 for image in together)
    assert cache.loads == 1


def test_a_flow_matching_family_refuses_a_noise_sampler_for_the_job(cache_dir):
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    with pytest.raises(InvalidJobSpec, match="'dpm\\+\\+2m' predicts noise; StableDiffusion3Pipeline"):
        generate(cache, "tiny-sd3", ["a red fox"], [1], sampler="dpm++2m")


def write_tiny_sd15(folder: Path) -> Path:
    """A Stable Diffusion 1.5-architecture folder at toy widths (one CLIP, no added conditions),
    the kind of pipeline no family of its own runs."""
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = models.byte_tokenizer()
    with models.drawn(models.TINY_SEED, torch.float32, "cpu"):
        blocks = {
            "down_block_types": ("DownBlock2D", "CrossAttnDownBlock2D"),
            "up_block_types": ("CrossAttnUpBlock2D", "UpBlock2D"),
        }
        unet = UNet2DConditionModel(
            sample_size=32, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32,
            attention_head_dim=(2, 4), norm_num_groups=32, **blocks,
        )  # fmt: skip
        text = CLIPTextModel(CLIPTextConfig(**models.TINY_TEXT, **models.clip_ids(tokenizer)))
        vae = AutoencoderKL(**models.TINY_VAE)
    scheduler = EulerDiscreteScheduler(**models.SCHEDULER)
    pipe = StableDiffusionPipeline(
        vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    models.save_whole(pipe, folder)
    return folder


def test_any_other_text_to_image_pipeline_runs_eagerly_and_says_which_levers_it_left_out(tmp_path, caplog):
    folder = write_tiny_sd15(tmp_path / "sd15")
    cache = WarmPipelines(str(tmp_path / "cache"), device="cpu", speedups="vae-fp16,compile-unet")
    with caplog.at_level(logging.INFO, logger="diffq.worker"):
        images = generate(cache, str(folder), ["a red fox", "a cat"], [7, 8], sampler="ddim")
    loaded, _ = cache.get(str(folder))
    assert families.family_of(loaded.pipe) is families.FAMILIES[-1]
    assert loaded.speedups.levers == frozenset() and not loaded.speedups.compiles
    said = caplog.text
    assert "is a StableDiffusionPipeline: run eagerly by the generic family" in said
    assert "speedups: compile-unet,vae-fp16 do not apply to a diffusers pipeline (StableDiffusionPipeline)" in said
    assert len(images) == 2 and not np.array_equal(images[0], images[1])


def test_a_folder_whose_pipeline_no_family_runs_is_refused_at_enqueue_and_by_a_worker(env, conn, tmp_path):
    """Refused before anything is queued, with the flag and what runs; a worker that meets one
    anyway (enqueued with the checks off, or a hub id) says the same and does not fail the job."""
    folder = write_tiny_sd15(tmp_path / "img2img")
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps({**index, "_class_name": "StableDiffusionImg2ImgPipeline"}))
    rows = write_csv(tmp_path / "p.csv", "prompt\na fox\n")
    done = producer("enqueue", rows, "--model", str(folder), "--output", tmp_path / "out")
    assert done.exit_code != 0
    (line,) = [text for text in done.output.splitlines() if text.strip()]
    assert f"--model '{folder}' is a StableDiffusionImg2ImgPipeline, which is not text-to-image" in line
    assert "SDXL, FLUX, SD3, PixArt" in line and "Traceback" not in done.output
    assert conn.llen("rq:queue:diffq") == 0
    cache = WarmPipelines(str(tmp_path / "cache"), device="cpu", speedups="none")
    with pytest.raises(ModelLoadError, match="is a StableDiffusionImg2ImgPipeline, which is not text-to-image"):
        cache.get(str(folder))


@pytest.mark.worker
def test_a_campaign_over_two_families_and_three_samplers_makes_every_image_once_and_a_rerun_adds_nothing(
    env, conn, tmp_path
):
    """One file, two families by its ``model`` column (an empty cell is ``--model``'s)."""
    out = tmp_path / "out"
    rows = write_csv(
        tmp_path / "two.csv",
        "prompt,sampler,model\na fox,dpm++2m-karras,tiny-pixart\na fox,,\na fox,unipc,tiny-pixart\n"
        "a bird,euler,\na fox,ddim,tiny-pixart\n",
    )
    flags = ("--model", "tiny-sd3", "--width", "64", "--height", "64", "--steps", "3", "--output", out)
    assert producer("enqueue", rows, *flags).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 5)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert sorted((line["model"], line["sampler"] or "") for line in lines) == [
        ("tiny-pixart", "ddim"), ("tiny-pixart", "dpm++2m-karras"), ("tiny-pixart", "unipc"),
        ("tiny-sd3", ""), ("tiny-sd3", "euler"),
    ]  # fmt: skip
    again = producer("enqueue", rows, *flags)
    assert again.exit_code == 0 and "0 new" in again.output, again.output


@pytest.mark.worker
@pytest.mark.long  # a second worker test of the families (make test has the campaign)
def test_status_shows_each_models_last_failed_load_until_it_loads(env, conn, cache_dir, tmp_path):
    """A folder that names an SDXL pipeline but lost its UNet's weights passes the enqueue and
    cannot load on a worker: the job stays (the worker's environment, not the job), and
    ``producer status`` says which model did not load where and why; once it loads, it says no more."""
    import shutil
    import subprocess
    import sys

    from conftest import ROOT, run_worker

    model = tmp_path / "broken-sdxl"
    shutil.copytree(cache_dir / "models" / "tiny", model)
    weights = next((model / "unet").glob("*.safetensors"))
    kept = weights.rename(tmp_path / weights.name)
    rows = write_csv(tmp_path / "p.csv", "prompt\na fox\n")
    flags = ("--model", str(model), "--width", "64", "--height", "64", "--steps", "2", "--output", tmp_path / "out")
    assert producer("enqueue", rows, *flags).exit_code == 0
    run_worker(env, "--name", "W1")

    def status() -> tuple[str, dict]:
        cmd = [sys.executable, "-m", "producer", "status"]
        text = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
        raw = subprocess.run([*cmd, "--json"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return text, json.loads(raw.stdout)

    text, said = status()
    assert said["jobs"]["queued"] == 1 and said["jobs"]["failed"] == 0, said  # the job waits, whole
    (line,) = [line for line in text.splitlines() if line.strip().startswith("model ")]
    assert f"{model} did not load on W1" in line and "cannot be loaded" in line, text
    assert said["load_failures"][str(model)]["worker"] == "W1"
    kept.rename(weights)
    run_worker(env, "--name", "W2")
    assert_exactly_once(tmp_path / "out", 1)
    text, said = status()
    assert said["load_failures"] == {} and "did not load" not in text


@pytest.mark.worker
def test_every_row_over_several_models_one_models_jobs_after_the_others(env, conn, tmp_path):
    """``--model a --model b``: each row once for each model, each model's jobs queued together
    (a worker with one model warm loads each once, not once a job), a bad model refused before
    anything is queued, the same command again adding nothing."""
    from rq.job import Job
    from rq.serializers import JSONSerializer

    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"a fox {i}\n" for i in range(3)))
    out = tmp_path / "out"
    flags = ("--width", "64", "--height", "64", "--steps", "2", "--chunk-size", "1", "--output", out)
    bad = producer("enqueue", rows, "--model", "tiny", "--model", "tinyy", *flags)
    assert bad.exit_code != 0 and "did you mean 'tiny'" in bad.output and conn.llen("rq:queue:diffq") == 0
    assert producer("enqueue", rows, "--model", "tiny-pixart", "--model", "tiny", *flags).exit_code == 0
    ids = [jid.decode() for jid in conn.lrange("rq:queue:diffq", 0, -1)]
    order = [
        Job.fetch(jid, connection=conn, serializer=JSONSerializer).kwargs["spec"]["params"]["model"] for jid in ids
    ]
    assert order == ["tiny-pixart"] * 3 + ["tiny"] * 3
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 6)
    again = producer("enqueue", rows, "--model", "tiny-pixart", "--model", "tiny", *flags)
    assert again.exit_code == 0 and again.output.count("0 new") == 2, again.output
