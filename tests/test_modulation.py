"""``modulation-once`` (worker/pipelines/modulation.py) on the CPU with a tiny FLUX: every
modulating layer's output at every step is the one the layer computes, images and all, across
prompts, batch sizes and schedules; the compiled blocks build no more graphs for it; the rows
the layers read stay at one address (a CUDA graph's replay reads them there). What it saves is
measured on GPUs (docs/groups.md)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from test_speedups import TINY_FLUX
from test_step_graphs import ReplayedOnCpu

from common.jobspec import GenParams
from worker.pipelines import modulation
from worker.pipelines.generate import run_batch
from worker.pipelines.models import build_flux
from worker.pipelines.speedups import Speedups, apply, graphs_compiled

ARCH = {**TINY_FLUX, "transformer": {**TINY_FLUX["transformer"], "num_layers": 2, "num_single_layers": 2}}
PARAMS = GenParams(model="tiny-flux", width=32, height=32, steps=3, guidance=3.5)


def pixels(result: Any) -> list[np.ndarray]:
    return [np.asarray(image, dtype=np.int16) for image in result.images]


def record(pipe: Any) -> list[tuple[str, torch.Tensor]]:
    """Every modulating layer's output, call by call, in order."""
    seen: list[tuple[str, torch.Tensor]] = []
    modulating = {id(linear) for linear in modulation._modulating_linears(pipe.transformer)}
    for name, module in pipe.transformer.named_modules():
        if id(module) in modulating:

            def hook(_m: Any, _args: Any, out: torch.Tensor, name: str = name) -> None:
                seen.append((name, out.detach().clone()))

            module.register_forward_hook(hook)
    return seen


@pytest.fixture(scope="module")
def eager() -> Any:
    return build_flux(**ARCH, t5_vocab=None, clip_vocab=None)


def test_every_layer_reads_its_own_steps_vectors_across_prompts_batches_and_schedules(eager: Any) -> None:
    eager, tabled = copy.deepcopy(eager), copy.deepcopy(eager)  # the hooks below stay on these copies
    table = modulation.install(tabled)
    assert table is not None and len(table.linears) == 2 * 2 + 2 + 1  # two norms a double block, one a single, the last
    assert all(isinstance(linear, modulation.TabledLinear) for linear in table.linears)
    want, got = record(eager), record(tabled)
    jobs = [
        (PARAMS, ["a red fox", "a blue jay"], [3, 4]),
        (PARAMS, ["Straße im Regen"], [5]),  # another prompt and batch: a new table
        (GenParams(**{**PARAMS.__dict__, "steps": 5, "guidance": 7.0}), ["a red fox"], [3]),  # another schedule
    ]
    for params, prompts, seeds in jobs:
        reference = run_batch(eager, params, prompts, [""] * len(prompts), seeds)
        result = run_batch(tabled, params, prompts, [""] * len(prompts), seeds)
        for ref, image in zip(pixels(reference), pixels(result), strict=True):
            assert np.abs(ref - image).max() <= 1
    assert table.builds == len(jobs)  # once an image's pipeline call, not once a step
    assert [name for name, _ in got] == [name for name, _ in want]
    assert len(got) == len(table.linears) * sum(p.steps for p, _, _ in jobs)
    worst = max(float((a - b).abs().max()) for (_, a), (_, b) in zip(want, got, strict=True))
    assert worst <= 1e-5, worst
    # undone: the layers are plain linears again and compute at every call
    assert modulation.remove(tabled)
    assert not any(isinstance(m, modulation.TabledLinear) for m in tabled.transformer.modules())
    again = run_batch(tabled, PARAMS, ["a red fox"], [""], [3])
    reference = run_batch(eager, PARAMS, ["a red fox"], [""], [3])
    assert np.array_equal(pixels(again)[0], pixels(reference)[0])


def test_a_sdxl_pipeline_or_a_call_outside_a_schedule_computes_as_before(eager: Any) -> None:
    tabled = copy.deepcopy(eager)
    table = modulation.install(tabled)
    assert table is not None
    tabled.scheduler.timesteps = None  # as before set_timesteps: nothing to table
    transformer, inputs = tabled.transformer, _inputs(tabled)
    out = transformer(**inputs, return_dict=False)[0]
    assert all(linear.tabled is None for linear in table.linears) and table.builds == 0
    assert torch.allclose(out, eager.transformer(**inputs, return_dict=False)[0], atol=1e-6)
    assert modulation.install(type("Sdxl", (), {"unet": torch.nn.Linear(1, 1), "scheduler": None})()) is None


def _inputs(pipe: Any) -> dict[str, torch.Tensor]:
    config = pipe.transformer.config
    generator = torch.Generator().manual_seed(0)
    return {
        "hidden_states": torch.randn(1, 16, config.in_channels, generator=generator),
        "encoder_hidden_states": torch.randn(1, 8, config.joint_attention_dim, generator=generator),
        "pooled_projections": torch.randn(1, config.pooled_projection_dim, generator=generator),
        "timestep": torch.tensor([0.5]),
        "guidance": torch.tensor([3.5]),
        "img_ids": torch.zeros(16, 3),
        "txt_ids": torch.zeros(8, 3),
    }


def test_replayed_calls_read_the_rows_where_their_capture_saw_them(eager: Any) -> None:
    """Under cuda-graphs the transformer's call is a replay; the hook runs before it and writes
    the step's rows where the capture read them."""
    tabled = copy.deepcopy(eager)
    table = modulation.install(tabled)
    assert table is not None
    graphs = ReplayedOnCpu(tabled.transformer, max_rows=1 << 30)
    addresses = []
    for prompt in ("a red fox", "a blue jay"):
        reference = run_batch(eager, PARAMS, [prompt], [""], [3])
        result = run_batch(tabled, PARAMS, [prompt], [""], [3])
        assert np.abs(pixels(reference)[0] - pixels(result)[0]).max() <= 1
        addresses.append([linear.tabled.data_ptr() for linear in table.linears])
    assert graphs.captures == 1 and graphs.replays == 2 * PARAMS.steps
    assert addresses[0] == addresses[1]


@pytest.mark.slow  # two compiles of the tiny FLUX's blocks
@pytest.mark.long
def test_compiled_blocks_build_no_more_graphs_with_the_table(eager: Any) -> None:
    """The layers' rows are inputs of the blocks' graphs: one graph a kind of block serves every
    block, as without the table (an attribute read as a constant would compile one graph a block)."""
    built = []
    for levers in ({"compile-blocks"}, {"compile-blocks", "modulation-once"}):
        pipe = copy.deepcopy(eager)
        apply(pipe, Speedups(frozenset(levers)))
        before = graphs_compiled()
        first = run_batch(pipe, PARAMS, ["a red fox"], [""], [3])
        built.append(graphs_compiled() - before)
        reference = run_batch(eager, PARAMS, ["a red fox"], [""], [3])
        assert np.abs(pixels(reference)[0] - pixels(first)[0]).max() <= 2
    assert built[1] <= built[0], built  # (3 and 2 here: one graph a block would be 4 and more)
