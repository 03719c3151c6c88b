"""Single-file checkpoints (issue 77): ``--model fine-tune.safetensors``, the way most fine-tuned
SDXL models are shared. The producer reads the file's header at enqueue and refuses, with the
flag and why, a file that is no whole model or one no family runs; a worker loads it with
diffusers' ``from_single_file`` and its configs from the folder beside it. The file here is a
tiny SDXL written under the original key names by tests/single_file.py; loaded, it must give
the pixels of the folder it was written from.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_exactly_once, drain, producer, write_csv
from single_file import write_single_file, write_tiny_sdxl

from common import checkpoints
from common.errors import ModelLoadError
from common.jobspec import GenParams
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines

SIZE = {"width": 64, "height": 64, "steps": 3, "guidance": 5.0}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the tiny SDXL folder, its single-file export beside a copy of its configs)."""
    root = tmp_path_factory.mktemp("single")
    folder = write_tiny_sdxl(root / "tiny-sdxl")
    return folder, write_single_file(folder, root / "fine-tune" / "tiny-ft.safetensors")


def images(cache: WarmPipelines, model: str) -> list[np.ndarray]:
    loaded, _ = cache.get(model)
    batch = Batch(
        params=GenParams(model=model, **SIZE), prompts=["a red fox", "a cat"], negatives=["", ""],
        seeds=[7, 8], max_batch=2,
    )  # fmt: skip
    result, _ = cache.generate(loaded, batch)
    return [np.asarray(image) for image in result.images]


def fake_checkpoint(path: Path, tensors: dict[str, list[int]]) -> Path:
    """A safetensors file of zero tensors with these names and shapes (only headers are read)."""
    table, offset = {}, 0
    for name, shape in tensors.items():
        size = 2 * int(np.prod(shape))
        table[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(table).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + bytes(offset))
    return path


def test_the_header_names_the_pipeline_by_the_keys_diffusers_reads():
    """The table the producer reads without torch uses the key names diffusers' single-file
    loader recognises, so what enqueue accepts is what a worker loads."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES as THEIRS

    cases = {
        THEIRS["open_clip_sdxl"]: "StableDiffusionXLPipeline",
        THEIRS["open_clip_sdxl_refiner"]: "StableDiffusionXLImg2ImgPipeline",
        THEIRS["sd3"][0]: "StableDiffusion3Pipeline",
        THEIRS["sd3"][1]: "StableDiffusion3Pipeline",
        THEIRS["flux"][0]: "FluxPipeline",
        THEIRS["flux"][1]: "FluxPipeline",
    }
    for key, pipeline in cases.items():
        assert checkpoints.checkpoint_pipeline({key: {"dtype": "F16", "shape": [4]}}) == pipeline, key
    unet = {"model.diffusion_model.input_blocks.0.0.weight": {"dtype": "F16", "shape": [320, 4, 3, 3]}}
    assert checkpoints.checkpoint_pipeline({**unet, THEIRS["clip"]: {"dtype": "F16", "shape": [77, 768]}}) == (
        "StableDiffusionPipeline"
    )
    assert checkpoints.checkpoint_pipeline({"lora_unet_down.lora_up.weight": {"dtype": "F16", "shape": [4]}}) is None


def test_a_single_file_checkpoint_loads_with_the_pixels_of_the_folder_it_was_written_from(checkpoint, tmp_path):
    folder, file = checkpoint
    assert checkpoints.checkpoint_pipeline(checkpoints.header(file)) == "StableDiffusionXLPipeline"
    assert not list(file.parent.glob("*/*.safetensors"))  # the configs beside it hold no weights
    cache = WarmPipelines(str(tmp_path / "cache"), device="cpu", speedups="none")
    from_file, from_folder = images(cache, str(file)), images(cache, str(folder))
    assert type(cache.get(str(file))[0].pipe).__name__ == "StableDiffusionXLPipeline"
    assert all(np.array_equal(a, b) for a, b in zip(from_file, from_folder, strict=True))
    assert not np.array_equal(from_file[0], from_file[1]) and from_file[0].std() > 0


def test_a_single_file_with_no_configs_here_is_the_workers_problem_in_one_line(checkpoint, tmp_path):
    """Alone in a folder, diffusers would fetch its base model's configs from the Hub; a worker
    that cannot says so in one line (a ModelLoadError: the job goes back, it is not failed)."""
    alone = tmp_path / "alone" / "tiny-ft.safetensors"
    alone.parent.mkdir()
    alone.write_bytes(checkpoint[1].read_bytes())
    assert checkpoints.config_folder(alone) is None
    cache = WarmPipelines(str(tmp_path / "cache"), device="cpu", speedups="none")
    with pytest.raises(ModelLoadError, match="cannot be loaded") as caught:
        cache.get(str(alone))
    assert "\n" not in str(caught.value) and str(alone) in str(caught.value)


@pytest.mark.parametrize(
    "name, tensors, said",
    [
        ("model.ckpt", None, "is a .ckpt file; diffq loads single-file checkpoints from .safetensors only"),
        ("noise.safetensors", None, "noise.safetensors is not a safetensors file (no header)"),
        ("lora.safetensors", {"lora_unet_x.lora_down.weight": [4, 8]}, "is a safetensors file but no whole model"),
        (
            "inpaint.safetensors",
            {"model.diffusion_model.input_blocks.0.0.weight": [320, 9, 3, 3],
             "conditioner.embedders.1.model.positional_embedding": [77, 1280]},
            "is a StableDiffusionXLInpaintPipeline, which needs an image beside the prompt",
        ),
    ],
)  # fmt: skip
def test_a_file_that_is_no_model_diffq_runs_is_refused_at_enqueue_in_one_line(env, conn, tmp_path, name, tensors, said):
    path = tmp_path / name
    if tensors is None:
        path.write_bytes(b"\x00\x01 not a checkpoint" * 8)
    else:
        fake_checkpoint(path, tensors)
    rows = write_csv(tmp_path / "p.csv", "prompt\na fox\n")
    done = producer("enqueue", rows, "--model", str(path), "--output", tmp_path / "out")
    assert done.exit_code != 0 and "Traceback" not in done.output
    (line,) = [text for text in done.output.splitlines() if text.strip()]
    assert line.startswith(f"error: --model '{path}'") or f"--model '{path}'" in line, line
    assert said in line, line
    assert conn.llen("rq:queue:diffq") == 0


@pytest.mark.long  # make test: the in-process load of the same file, pixel for pixel
@pytest.mark.worker
def test_a_campaign_of_a_single_file_checkpoint_makes_its_images_once(env, conn, checkpoint, tmp_path):
    out = tmp_path / "out"
    rows = write_csv(tmp_path / "p.csv", "prompt,sampler\na fox,\na bird,dpm++2m-karras\n")
    flags = ("--model", str(checkpoint[1]), "--width", "64", "--height", "64", "--steps", "3", "--output", out)
    assert producer("enqueue", rows, *flags).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 2)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert {line["model"] for line in lines} == {str(checkpoint[1])}
    again = producer("enqueue", rows, *flags)
    assert again.exit_code == 0 and "0 new" in again.output, again.output
