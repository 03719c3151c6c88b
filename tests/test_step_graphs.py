"""``cuda-graphs`` and ``encoder-graphs`` (worker/pipelines/step_graphs.py) on the CPU with the tiny model.

CUDA graphs need a GPU; what they do is measured there (docs/groups.md, docs/benchmarks.md).
Here :class:`ReplayedOnCpu` stands in for the three CUDA calls and keeps the one rule a real
graph lives by: a replay reads the memory its capture saw, so it refuses to run once any of the
module's weights has moved (a real graph would silently compute with the old memory). Everything
else is the product's own code: the shape keys, the copies in and out, the rows limit, the reset
after an adapter switch, the pause for the memory probe, the fallback when a capture fails.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten

from common.jobspec import GenParams
from worker.pipelines import step_graphs
from worker.pipelines.backend import Batch
from worker.pipelines.speedups import Speedups
from worker.pipelines.step_graphs import StepGraphs
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3, guidance=5.0)


class ReplayedOnCpu(StepGraphs):
    """A graph as a recording: the capture's inputs, outputs and weight addresses; a replay
    recomputes into the capture's output buffers, and fails where a real one would go wrong."""

    def __init__(self, module: torch.nn.Module, **kwargs: Any) -> None:
        self.module = module
        self.warm_calls = 0
        super().__init__(module, **kwargs)

    def _addresses(self) -> list[int]:
        return [p.data_ptr() for p in self.module.parameters()]

    def _warm(self, args: tuple, kwargs: dict) -> None:
        for _ in range(step_graphs.WARMUP_CALLS):
            self.eager(*args, **kwargs)
            self.warm_calls += 1

    def _record(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        out = self.eager(*args, **kwargs)
        return {"args": args, "kwargs": kwargs, "out": out, "addresses": self._addresses()}, out

    def _replay(self, graph: Any) -> None:
        assert self._addresses() == graph["addresses"], "a graph replayed after the weights moved"
        fresh = self.eager(*graph["args"], **graph["kwargs"])
        for mine, new in zip(tree_flatten(graph["out"])[0], tree_flatten(fresh)[0], strict=True):
            mine.copy_(new)  # into the capture's buffers: what an earlier call was handed is overwritten


def images(cache: WarmPipelines, n: int, adapter: str | None = None, negative: str = "") -> list[np.ndarray]:
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, adapter, 1.0)
    params = GenParams(**{**PARAMS.__dict__, "adapter": adapter})
    prompts, negatives = [f"a red fox {i}" for i in range(n)], [negative and f"{negative} {i}" for i in range(n)]
    batch = Batch(params, prompts, negatives, list(range(3, 3 + n)), max_batch=n)
    result, _ = cache.generate(loaded, batch)
    return [np.asarray(image, dtype=np.int16) for image in result.images]


def flux_image(pipe: Any, steps: int) -> np.ndarray:
    """One 64x64 image of a tiny FLUX pipeline, seeded."""
    generator = torch.Generator().manual_seed(3)
    return pipe("a red fox", width=64, height=64, num_inference_steps=steps, guidance_scale=3.5,
                generator=generator, output_type="np").images[0]  # fmt: skip


@pytest.fixture
def graphed(cache_dir) -> tuple[WarmPipelines, ReplayedOnCpu]:
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    return cache, ReplayedOnCpu(cache.get("tiny")[0].pipe.unet)


def test_replayed_unet_calls_make_the_same_images_one_capture_per_shape(plain, graphed):
    cache, graphs = graphed
    for n in (2, 1, 2):
        for ref, got in zip(images(plain, n), images(cache, n), strict=True):
            assert np.array_equal(ref, got)
    # CFG: 4 rows and 2 rows, one capture each; every step of every job a replay
    assert (graphs.captures, graphs.warm_calls) == (2, 2 * step_graphs.WARMUP_CALLS)
    assert graphs.replays == 3 * PARAMS.steps


def test_calls_of_more_rows_than_the_limit_run_without_a_graph(plain, cache_dir):
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    graphs = ReplayedOnCpu(cache.get("tiny")[0].pipe.unet, max_rows=2)
    for ref, got in zip(images(plain, 2), images(cache, 2), strict=True):  # 4 rows with CFG
        assert np.array_equal(ref, got)
    assert (graphs.captures, graphs.replays) == (0, 0)
    images(cache, 1)
    assert (graphs.captures, graphs.replays) == (1, PARAMS.steps)


def test_an_adapter_switch_drops_the_graphs_and_the_next_call_captures_again(plain, graphed):
    """Weights that an adapter's merge gives new memory would be read stale by an old graph
    (ReplayedOnCpu fails then); after every switch the images are the unwrapped pipeline's."""
    cache, graphs = graphed
    images(cache, 1)
    assert graphs.captures == 1
    loaded = cache.get("tiny")[0]
    for adapter in ("tiny-dora", None, "tiny-dora"):
        before = graphs.captures
        for ref, got in zip(images(plain, 1, adapter), images(cache, 1, adapter), strict=True):
            assert np.array_equal(ref, got)
        assert graphs.captures == before + 1
    # the same adapter again: nothing switched, nothing captured
    images(cache, 1, "tiny-dora")
    assert graphs.captures == 4
    # and a moved weight without a reset is caught by the stand-in (what the reset is for)
    first = next(loaded.pipe.unet.parameters())
    first.data = first.data.clone()
    with pytest.raises(AssertionError, match="weights moved"):
        images(cache, 1, "tiny-dora")


def test_the_memory_probe_and_a_failed_capture_run_the_unet_without_graphs(plain, graphed, caplog):
    cache, graphs = graphed
    pipe = cache.get("tiny")[0].pipe
    assert step_graphs.installed(pipe) is graphs
    with step_graphs.paused(pipe):
        images(cache, 1)
    assert (graphs.captures, graphs.replays) == (0, 0)

    def fails(args: tuple, kwargs: dict) -> None:
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    graphs._record = fails  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        for ref, got in zip(images(plain, 1), images(cache, 1), strict=True):
            assert np.array_equal(ref, got)
    assert graphs.broken and graphs.captures == 0
    lines = [r.getMessage() for r in caplog.records if "cuda-graphs" in r.getMessage()]
    assert lines == [
        "cuda-graphs: capturing the UNet's call failed (RuntimeError: operation not permitted when stream is "
        "capturing); this worker runs it without CUDA graphs"
    ]


def test_a_call_that_varies_a_plain_value_stops_capturing_at_the_limit(graphed, caplog):
    """A timestep given as a float would be a new signature every step: at most MAX_GRAPHS graphs."""
    _cache, graphs = graphed
    calls = []
    graphs.eager = lambda sample, t: calls.append(t) or sample * t  # type: ignore[method-assign]
    sample = torch.ones(2, 3)
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        outs = [graphs(sample, float(t)) for t in range(10)]
    assert all(torch.equal(out, sample * t) for t, out in enumerate(outs))
    assert graphs.captures == step_graphs.MAX_GRAPHS == len(graphs.graphs)
    assert graphs.replays == step_graphs.MAX_GRAPHS
    assert [m for m in caplog.messages if "cuda-graphs" in m] == [
        "cuda-graphs: the UNet was called with more than 4 shapes; calls of new shapes run without CUDA graphs"
    ]


def test_a_cfg_pairs_split_forward_leads_to_its_graphs(graphed):
    cache, graphs = graphed
    pipe = cache.get("tiny")[0].pipe

    def split_forward(*args: Any, **kwargs: Any) -> Any:
        return graphs(*args, **kwargs)

    split_forward.graphs = step_graphs.installed(pipe)  # type: ignore[attr-defined]  # as worker/group/engine.py does
    pipe.unet.forward = split_forward
    images(cache, 1)
    assert graphs.captures == 1
    step_graphs.reset(pipe)
    assert graphs.graphs == {}


def test_the_lever_on_a_cpu_worker_says_it_needs_a_gpu_and_changes_nothing(plain, cache_dir, caplog):
    assert "cuda-graphs" in Speedups.parse("auto,cuda-graphs", torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="diffq.worker"):
        cache = WarmPipelines(str(cache_dir), device="cpu", speedups="cuda-graphs")
        got = images(cache, 1)
    assert not isinstance(cache.get("tiny")[0].pipe.unet.forward, StepGraphs)
    assert "speedups: cuda-graphs needs the UNet on a CUDA GPU; this one runs without them" in caplog.messages
    assert all(np.array_equal(a, b) for a, b in zip(images(plain, 1), got, strict=True))


def test_a_flux_groups_transformer_is_graphed_whole_and_released_before_the_group_is_left(caplog):
    """A Ulysses group graphs every transformer call (its all-to-alls inside: on a GPU the graph
    holds NCCL's communicators), and drops the graphs before its process group is destroyed."""
    from test_speedups import TINY_FLUX

    from worker.group.engine import ALL_ROWS
    from worker.pipelines.models import build_flux

    pipe = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)

    def image(pipe: Any) -> np.ndarray:
        return flux_image(pipe, steps=3)

    plain = image(pipe)
    with caplog.at_level(logging.INFO, logger="diffq.worker"):
        assert step_graphs.install(pipe.transformer, ALL_ROWS) is None  # what a CPU group gets
    assert caplog.messages == ["speedups: cuda-graphs needs the transformer on a CUDA GPU; this one runs without them"]
    graphs = ReplayedOnCpu(pipe.transformer, max_rows=ALL_ROWS)
    assert step_graphs.installed(pipe) is graphs
    graphed = image(pipe)
    assert (graphs.captures, graphs.replays) == (1, 3)  # one shape, every step replayed
    assert np.abs(plain - graphed).max() == 0
    assert step_graphs.release(pipe)
    assert graphs.graphs == {}
    after = image(pipe)  # a rank that lingers runs without graphs, capturing nothing again
    assert (graphs.captures, graphs.replays) == (1, 3)
    assert np.abs(plain - after).max() == 0


@pytest.fixture
def encoders(cache_dir) -> tuple[WarmPipelines, list[ReplayedOnCpu]]:
    """``encoder-graphs`` on the tiny model's two CLIPs (what the lever installs on a GPU)."""
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    pipe = cache.get("tiny")[0].pipe
    return cache, [ReplayedOnCpu(m, lever="encoder-graphs") for m in (pipe.text_encoder, pipe.text_encoder_2)]


def test_replayed_text_encoder_calls_make_the_same_images_with_and_without_a_negative_prompt(plain, encoders):
    """One capture per encoder and batch size, a replay per call. A negative prompt is a second
    call of the same shape, whose replay overwrites the graph's outputs: the prompt's embeddings
    (SDXL's pooled one is the second encoder's output as it came) must have been copied out."""
    cache, graphs = encoders
    assert step_graphs.every(cache.get("tiny")[0].pipe) == graphs
    for n, negative in ((2, ""), (1, ""), (2, "blurry"), (1, "blurry")):
        for ref, got in zip(images(plain, n, negative=negative), images(cache, n, negative=negative), strict=True):
            assert np.array_equal(ref, got)
    for g in graphs:  # batches 2, 1; the negatives' calls replay the same two shapes
        assert (g.captures, g.replays, g.warm_calls) == (2, 6, 2 * step_graphs.WARMUP_CALLS)


def text_encoder_lora(cache_dir: Any, folder: Any) -> str:
    """A LoRA of the tiny model's first text encoder alone (random, so it changes the image):
    diffq merges it through PEFT, which wraps that encoder's layers."""
    from diffusers import StableDiffusionXLPipeline
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    from worker.pipelines.models import ensure_tiny

    pipe = StableDiffusionXLPipeline.from_pretrained(ensure_tiny(cache_dir))
    torch.manual_seed(5)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    inject_adapter_in_model(config, pipe.text_encoder)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(pipe.text_encoder))
    StableDiffusionXLPipeline.save_lora_weights(folder, text_encoder_lora_layers=layers)
    return str(folder)


@pytest.mark.long  # make test: an adapter switch drops the graphs and the next call captures again
def test_an_adapter_switch_captures_again_only_the_encoders_it_changed(plain, encoders, cache_dir, tmp_path):
    """tiny-dora adapts the UNet alone: the encoders' graphs stay. A LoRA of the first text
    encoder (wrapped and merged by PEFT) drops that encoder's graphs at every switch, and its
    images are the unwrapped pipeline's with the same adapter."""
    cache, (first, second) = encoders
    te_lora = text_encoder_lora(cache_dir, tmp_path / "te-lora")
    images(cache, 1)
    for adapter in ("tiny-dora", None, "tiny-dora"):
        for ref, got in zip(images(plain, 1, adapter), images(cache, 1, adapter), strict=True):
            assert np.array_equal(ref, got)
    assert (first.captures, second.captures) == (1, 1)
    without = images(plain, 1)
    for adapter in (te_lora, None, te_lora):
        refs = images(plain, 1, adapter)
        assert adapter is None or not np.array_equal(refs[0], without[0])  # the adapter changes the image
        for ref, got in zip(refs, images(cache, 1, adapter), strict=True):
            assert np.array_equal(ref, got)
    assert (first.captures, second.captures) == (4, 1)  # once after each switch; the second never touched


def test_encoder_graphs_are_paused_for_the_memory_probe_and_released(encoders):
    cache, graphs = encoders
    pipe = cache.get("tiny")[0].pipe
    with step_graphs.paused(pipe):
        images(cache, 1)
    assert [(g.captures, g.replays, g.paused) for g in graphs] == [(0, 0, False)] * 2
    images(cache, 1)
    first = next(pipe.text_encoder.parameters())  # a weight moved without a reset is caught
    first.data = first.data.clone()
    with pytest.raises(AssertionError, match="weights moved"):
        images(cache, 1)
    assert step_graphs.release(pipe) and all(g.graphs == {} and g.paused for g in graphs)


def test_the_encoder_lever_on_a_cpu_worker_says_it_needs_a_gpu_and_changes_nothing(plain, cache_dir, caplog):
    with caplog.at_level(logging.INFO, logger="diffq.worker"):
        cache = WarmPipelines(str(cache_dir), device="cpu", speedups="encoder-graphs")
        got = images(cache, 1)
    pipe = cache.get("tiny")[0].pipe
    assert step_graphs.every(pipe) == []
    assert [m for m in caplog.messages if "encoder-graphs needs" in m] == [
        f"speedups: encoder-graphs needs the text encoder ({kind}) on a CUDA GPU; this one runs without them"
        for kind in ("CLIPTextModel", "CLIPTextModelWithProjection")
    ]
    assert all(np.array_equal(a, b) for a, b in zip(images(plain, 1), got, strict=True))


def test_a_flux_pipelines_clip_and_t5_calls_are_replayed_with_the_same_image():
    from test_speedups import TINY_FLUX

    from worker.pipelines.models import build_flux

    pipe = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)

    def image(pipe: Any) -> np.ndarray:
        return flux_image(pipe, steps=2)

    plain = image(pipe)
    graphs = [ReplayedOnCpu(m, lever="encoder-graphs") for m in (pipe.text_encoder, pipe.text_encoder_2)]
    assert step_graphs.every(pipe) == graphs and type(pipe.text_encoder_2).__name__ == "T5EncoderModel"
    assert np.abs(plain - image(pipe)).max() == 0 and np.abs(plain - image(pipe)).max() == 0
    assert [(g.captures, g.replays) for g in graphs] == [(1, 2), (1, 2)]
