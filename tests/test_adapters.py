"""The real loading path: tiny model via from_pretrained, DoRA via load_lora_weights, set_adapters."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import AdapterNotFound, ModelLoadError
from common.jobspec import GenParams
from worker.pipelines.cache import PipelineCache
from worker.pipelines.generate import run_batch

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3)


@pytest.fixture(scope="module")
def cache(cache_dir) -> PipelineCache:
    return PipelineCache(str(cache_dir), device="cpu")


def render(cache: PipelineCache, adapter: str | None, scale: float = 1.0) -> np.ndarray:
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, adapter, scale)
    result = run_batch(loaded.pipe, PARAMS, ["a red fox"], [""], [7])
    return np.asarray(result.images[0], dtype=np.float32)


def test_dora_adapter_changes_the_image_and_switching_back_restores_it(cache):
    plain = render(cache, None)
    with_dora = render(cache, "tiny-dora")
    again = render(cache, None)
    assert np.abs(with_dora - plain).mean() > 1.0
    assert np.array_equal(again, plain)


def test_adapter_is_loaded_once_and_switched_not_reloaded(cache_dir, monkeypatch):
    cache = PipelineCache(str(cache_dir), device="cpu")  # a fresh worker's cache: nothing loaded yet
    loaded, _ = cache.get("tiny")
    calls = []
    original = loaded.pipe.load_lora_weights
    monkeypatch.setattr(loaded.pipe, "load_lora_weights", lambda *a, **k: calls.append(a) or original(*a, **k))
    for adapter in ("tiny-dora", None, "tiny-dora", None):
        render(cache, adapter, 0.5)
    assert len(calls) == 1  # loaded the first time it is named, switched after that
    assert list(loaded.adapters) == ["tiny-dora"]


def test_adapter_scale_changes_the_image(cache):
    assert not np.array_equal(render(cache, "tiny-dora", 1.0), render(cache, "tiny-dora", 0.3))


def test_same_seed_same_image_regardless_of_batch_mates(cache):
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, None, 1.0)
    alone = run_batch(loaded.pipe, PARAMS, ["a red fox"], [""], [7]).images[0]
    batch = run_batch(loaded.pipe, PARAMS, ["a blue bird", "a red fox"], ["", ""], [1, 7]).images[1]
    diff = np.abs(np.asarray(alone, dtype=np.float32) - np.asarray(batch, dtype=np.float32))
    assert diff.max() <= 2.0  # float rounding across batch shapes only


def test_missing_adapter_and_unknown_model_fail_with_a_reason(cache, tmp_path):
    loaded, _ = cache.get("tiny")
    with pytest.raises(AdapterNotFound, match="not found on this worker"):
        cache.use_adapter(loaded, str(tmp_path / "missing"), 1.0)
    with pytest.raises(ModelLoadError, match="cannot be loaded"):
        PipelineCache(str(tmp_path), device="cpu")._load(str(tmp_path / "no-model-here"))
