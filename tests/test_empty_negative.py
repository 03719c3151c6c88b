"""``empty-negative`` (worker/pipelines/empty_negative.py) on the CPU with the tiny model: the
unconditional rows of an empty negative prompt skip cross-attention, and the images are the ones
the full computation makes. What it saves is measured on a GPU (docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from diffusers.models.attention_processor import Attention

from common.jobspec import GenParams
from worker.pipelines import empty_negative
from worker.pipelines.backend import Batch
from worker.pipelines.empty_negative import EmptyNegativeProcessor
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3, guidance=5.0)


class Counting:
    """Wraps a layer's own processor: the rows each cross-attention call computed."""

    def __init__(self, inner: Any, rows: list[int]) -> None:
        self.inner, self.rows = inner, rows

    def __call__(
        self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, attention_mask: Any = None,
        temb: Any = None,
    ) -> Any:  # fmt: skip
        if encoder_hidden_states is not None:
            self.rows.append(hidden_states.shape[0])
        return self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, temb)


def cross_rows(pipe: Any) -> list[int]:
    """Count the rows every cross-attention computes from now on (under the lever's processor)."""
    rows: list[int] = []
    for module in pipe.unet.modules():
        if isinstance(module, Attention):
            processor = module.processor
            if isinstance(processor, EmptyNegativeProcessor):
                processor.inner = Counting(processor.inner, rows)
            else:
                module.set_processor(Counting(processor, rows))
    return rows


def images(cache: WarmPipelines, n: int, negative: str = "") -> list[np.ndarray]:
    loaded, _ = cache.get("tiny")
    batch = Batch(PARAMS, [f"a red fox {i}" for i in range(n)], [negative] * n, list(range(3, 3 + n)), max_batch=n)
    result, _ = cache.generate(loaded, batch)
    return [np.asarray(image, dtype=np.int16) for image in result.images]


@pytest.fixture
def lever(cache_dir) -> WarmPipelines:
    return WarmPipelines(str(cache_dir), device="cpu", speedups="empty-negative")


def test_an_empty_negative_skips_the_unconditional_rows_and_makes_the_same_images(plain, lever):
    assert lever.get("tiny")[0].pipe.config.force_zeros_for_empty_prompt  # SDXL's own config
    full, skipped = cross_rows(plain.get("tiny")[0].pipe), cross_rows(lever.get("tiny")[0].pipe)
    for ref, got in zip(images(plain, 2), images(lever, 2), strict=True):
        assert np.abs(ref - got).max() <= 1
    # CFG: 4 rows a call without the lever; the 2 conditional rows with it, in every layer and step
    assert set(full) == {4} and set(skipped) == {2}
    assert len(skipped) == len(full) > 0


def test_a_negative_prompt_runs_the_full_cross_attention(plain, lever):
    full, skipped = cross_rows(plain.get("tiny")[0].pipe), cross_rows(lever.get("tiny")[0].pipe)
    for ref, got in zip(images(plain, 2, "blurry"), images(lever, 2, "blurry"), strict=True):
        assert np.array_equal(ref, got)
    assert set(full) == set(skipped) == {4}


def test_a_layer_whose_projections_have_a_bias_runs_in_full():
    """Zero text states through a key projection with a bias are not zero keys: the premise fails
    and the processor computes every row (else the output would differ)."""
    torch.manual_seed(0)
    attn = Attention(query_dim=16, cross_attention_dim=8, heads=2, dim_head=8, bias=True).eval()
    plain_processor = attn.processor
    hidden = torch.randn(4, 5, 16)
    text = torch.cat([torch.zeros(2, 3, 8), torch.randn(2, 3, 8)])
    want = attn(hidden, text)
    attn.set_processor(EmptyNegativeProcessor(plain_processor))
    assert torch.allclose(attn(hidden, text, zero_rows=2), want, atol=1e-6)
    assert not empty_negative.exact(attn, hidden)
    attn.to_k.bias = attn.to_v.bias = None  # now zero states give zero keys and values: exact
    plain_want = EmptyNegativeProcessor(plain_processor)(attn, hidden, text)
    assert torch.allclose(attn(hidden, text, zero_rows=2), plain_want, atol=1e-6)


def test_a_cfg_pairs_halves_get_their_own_zero_rows():
    """A CFG pair's rank 0 runs the unconditional half (all zero rows), rank 1 the conditional."""
    batch = {empty_negative.ZERO_ROWS: 3}
    assert empty_negative.for_rows(batch, 0, 3) == {empty_negative.ZERO_ROWS: 3}
    assert empty_negative.for_rows(batch, 3, 3) == {empty_negative.ZERO_ROWS: 0}
    assert empty_negative.for_rows(None, 3, 3) is None
    torch.manual_seed(0)
    attn = Attention(query_dim=16, cross_attention_dim=8, heads=2, dim_head=8).eval()
    hidden = torch.randn(3, 5, 16)
    want = attn(hidden, torch.zeros(3, 3, 8))
    attn.set_processor(EmptyNegativeProcessor(attn.processor))
    assert torch.allclose(attn(hidden, torch.zeros(3, 3, 8), zero_rows=3), want, atol=1e-6)


@pytest.mark.long  # two CPU compiles of the UNet, 3 min: `make test-all`
@pytest.mark.slow
@pytest.mark.soak
def test_a_compiled_worker_warms_up_once_for_each_kind_of_negative_prompt(cache_dir, plain):
    """Under the lever a batch with an empty negative and one with a negative prompt run two
    graphs: each kind gets its warm-up (shown as the job's state) once, the same images as the
    plain pipeline's, and no graph after."""
    compiled = WarmPipelines(str(cache_dir), device="cpu", speedups="compile-unet,empty-negative")
    loaded, _ = compiled.get("tiny")

    def run(negative: str) -> tuple[Any, list]:
        heard: list = []
        batch = Batch(PARAMS, ["a red fox 0", "a red fox 1"], [negative] * 2, [3, 4], max_batch=2)
        result, _ = compiled.generate(loaded, batch, on_progress=heard.append)
        return result, heard

    for negative in ("", "blurry"):
        first, heard = run(negative)
        assert first.compiles > 0 and heard[0].startswith("compiling for 64x64")
        for ref, got in zip(images(plain, 2, negative), first.images, strict=True):
            assert np.abs(ref - np.asarray(got, dtype=np.int16)).max() <= 2
    assert [(run(n)[0].compiles, run(n)[1]) for n in ("", "blurry")] == [(0, []), (0, [])]
