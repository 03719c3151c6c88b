"""A batch's initial noise (worker/pipelines/noise.py): diffusers' numbers, drawn without the
``torch.cat`` that held an H200 idle for 135 ms of a 1 s few-step batch while the writer's
threads encoded PNGs beside it. The real loading code runs on the tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers.pipelines.stable_diffusion_xl import pipeline_stable_diffusion_xl
from diffusers.utils.torch_utils import randn_tensor
from torch.utils._python_dispatch import TorchDispatchMode

from common.jobspec import GenParams
from worker.pipelines import samplers
from worker.pipelines.generate import run_batch
from worker.pipelines.noise import initial_noise
from worker.pipelines.warm import WarmPipelines

SEEDS = [11, 12, 13]
SHAPE = (4, 16, 24)


class Ops(TorchDispatchMode):
    """The aten operators run inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def generators() -> list[torch.Generator]:
    return [torch.Generator("cpu").manual_seed(seed) for seed in SEEDS]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_noise_is_diffusers_draw_bit_for_bit_and_leaves_the_generators_where_it_leaves_them(dtype):
    ours, theirs = generators(), generators()
    drawn = initial_noise(ours, SHAPE, dtype, torch.device("cpu"))
    expected = randn_tensor((len(SEEDS), *SHAPE), generator=theirs, device=torch.device("cpu"), dtype=dtype)
    assert drawn.dtype == dtype and drawn.shape == expected.shape
    assert torch.equal(drawn, expected)
    for mine, other in zip(ours, theirs, strict=True):  # an ancestral sampler draws on from here
        assert torch.equal(mine.get_state(), other.get_state())


def test_the_noise_is_drawn_into_one_tensor_and_joined_by_no_cat():
    with Ops() as ops:
        initial_noise(generators(), SHAPE, torch.float16, torch.device("cpu"))
    assert "cat" not in ops.names and ops.names.count("normal_") + ops.names.count("randn") == len(SEEDS), ops.names
    with Ops() as ops:  # diffusers' draw, the one replaced
        randn_tensor((len(SEEDS), *SHAPE), generator=generators(), device=torch.device("cpu"), dtype=torch.float16)
    assert "cat" in ops.names


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache = Path(tmp_path_factory.mktemp("cache"))
    return WarmPipelines(str(cache), device="cpu", speedups="none").get("tiny")[0].pipe


@pytest.mark.parametrize("sampler", [None, "euler-a"])  # euler-a draws again at every step
def test_a_batch_makes_the_plain_pipelines_images_and_sdxl_draws_no_noise_of_its_own(tiny, sampler, monkeypatch):
    params = GenParams(model="tiny", width=64, height=48, steps=3, guidance=5.0, sampler=sampler)
    prompts = ["a red cube", "a blue sphere", "a green cone"]
    draws = []
    real = pipeline_stable_diffusion_xl.randn_tensor
    monkeypatch.setattr(pipeline_stable_diffusion_xl, "randn_tensor", lambda *a, **k: draws.append(1) or real(*a, **k))
    try:
        result = run_batch(tiny, params, prompts, [""] * 3, SEEDS)  # it sets the job's sampler
        assert not draws  # the pipeline got its latents
        plain = tiny(
            prompt=prompts,
            width=params.width,
            height=params.height,
            num_inference_steps=params.steps,
            guidance_scale=params.guidance,
            generator=generators(),
        ).images
    finally:
        samplers.use(tiny, None, None)  # the model's own again
    assert draws  # the plain call drew its own
    for image, expected in zip(result.images, plain, strict=True):
        assert np.array_equal(np.asarray(image), np.asarray(expected))
