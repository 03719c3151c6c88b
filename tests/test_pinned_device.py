"""A loaded pipeline looks its execution device up once (worker/pipelines/pinned_device.py).

diffusers walks every submodule of every component to answer ``_execution_device``, and a batch
asked twice: 10 ms of a one-image SDXL job on an H200, half of it while the GPU waited for the
first step. These run the real loading code on the tiny model and count the modules walked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from diffusers import DiffusionPipeline, StableDiffusionXLPipeline

from common.jobspec import GenParams
from worker.pipelines import pinned_device
from worker.pipelines.generate import run_batch
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)


class Walks:
    """Modules yielded by whole-tree walks (``named_modules``) that start at ``root``."""

    def __init__(self, root: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.seen = root, 0
        named_modules = torch.nn.Module.named_modules
        walks = self

        def counted(
            module: torch.nn.Module, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
        ) -> Iterator:
            for item in named_modules(module, memo, prefix, remove_duplicate):
                if memo is None and module is walks.root:
                    walks.seen += 1
                yield item

        monkeypatch.setattr(torch.nn.Module, "named_modules", counted)


@pytest.fixture
def loaded(cache_dir: Path) -> Any:
    return WarmPipelines(str(cache_dir), device="cpu", speedups="none").get("tiny")[0]


def test_a_batch_does_not_walk_the_unet_to_find_its_device(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = loaded.pipe
    unet_modules = sum(1 for _ in pipe.unet.modules())
    walks = Walks(pipe.unet, monkeypatch)
    run_batch(pipe, PARAMS, ["a red cube"], [""], [1])
    # parameters() starts a walk and stops at the first module that has one
    assert walks.seen < unet_modules, f"a batch walked {walks.seen} of the UNet's {unet_modules} modules"

    pinned_device.unpin(pipe)  # as diffusers made it: the same batch walks the UNet twice over
    walks.seen = 0
    run_batch(pipe, PARAMS, ["a red cube"], [""], [1])
    assert walks.seen >= 2 * unet_modules, walks.seen


def test_the_pinned_pipeline_is_the_one_loaded_and_gives_diffusers_answer(loaded: Any) -> None:
    pipe = loaded.pipe
    assert type(pipe).__name__ == "StableDiffusionXLPipeline" and isinstance(pipe, StableDiffusionXLPipeline)
    assert pipe._execution_device == DiffusionPipeline._execution_device.fget(pipe) == torch.device("cpu")


def test_moving_or_replacing_a_component_asks_again(loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = loaded.pipe
    asked: list[torch.device] = []
    lookup = DiffusionPipeline._execution_device.fget

    def counted(self: Any) -> torch.device:
        asked.append(lookup(self))
        return asked[-1]

    monkeypatch.setattr(DiffusionPipeline, "_execution_device", property(counted))
    pipe.__dict__.pop("_diffq_execution_device", None)
    for _ in range(3):
        assert pipe._execution_device == torch.device("cpu")
    assert len(asked) == 1, "the device was looked up again though nothing moved"
    pipe.to("cpu")
    assert pipe._execution_device == torch.device("cpu") and len(asked) == 2, "a move kept the old answer"
    pipe.vae = pipe.vae  # a component replaced: its hooks may differ
    assert pipe._execution_device == torch.device("cpu") and len(asked) == 3
    pipe.some_setting = 3  # not a component: the answer stands
    assert pipe._execution_device == torch.device("cpu") and len(asked) == 3
