"""The real loading path: tiny model via from_pretrained; adapters read and merged directly, or by PEFT."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from common.errors import AdapterNotFound, ModelLoadError
from common.jobspec import GenParams
from worker.pipelines import adapter_weights
from worker.pipelines.generate import run_batch
from worker.pipelines.models import DORA_TARGETS
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3)


@pytest.fixture(scope="module")
def cache(cache_dir) -> WarmPipelines:
    return WarmPipelines(str(cache_dir), device="cpu")


def render(cache: WarmPipelines, adapter: str | None, scale: float = 1.0) -> np.ndarray:
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
    cache = WarmPipelines(str(cache_dir), device="cpu")  # a fresh worker's cache: nothing loaded yet
    loaded, _ = cache.get("tiny")
    reads, peft_loads = [], []
    original = adapter_weights.read
    monkeypatch.setattr(adapter_weights, "read", lambda *a: reads.append(a) or original(*a))
    monkeypatch.setattr(loaded.pipe, "load_lora_weights", lambda *a, **k: peft_loads.append(a))
    for adapter in ("tiny-dora", None, "tiny-dora", None):
        render(cache, adapter, 0.5)
    assert len(reads) == 1  # read the first time it is named, switched after that
    assert peft_loads == []  # a plain DoRA on linear layers never meets PEFT
    assert list(loaded.adapters) == ["tiny-dora"]


def test_an_adapter_reaches_fused_projections_and_leaves_them_again(cache_dir):
    """Under ``fuse-qkv`` attention reads q, k and v from one fused layer, not from the
    ``to_q``/``to_k``/``to_v`` an adapter merges into: every switch copies the parts into it
    again, so an adapter job under the lever makes the image it makes without it, and a plain
    job after it the plain image."""
    fused = WarmPipelines(str(cache_dir), device="cpu", speedups="fuse-qkv")
    separate = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    assert any(getattr(m, "fused_projections", False) for m in fused.get("tiny")[0].pipe.unet.modules())
    plain = render(fused, None)
    with_dora = render(fused, "tiny-dora")
    assert np.abs(with_dora - render(separate, "tiny-dora")).max() <= 2
    assert np.abs(with_dora - plain).mean() > 1.0
    assert np.array_equal(render(fused, None), plain)


def make_lora(folder: Path, model_dir: Path, targets: list[str], *, alpha: int, metadata: bool, seed: int = 3) -> Path:
    """A rank-4 LoRA on the tiny UNet with random factors (drawn from ``seed``), saved as diffusers saves one."""
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(seed)
    unet = UNet2DConditionModel.from_pretrained(model_dir / "unet")
    config = LoraConfig(r=4, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    unet.add_adapter(config)
    layers = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet))
    extra = {"unet_lora_adapter_metadata": config.to_dict()} if metadata else {}
    StableDiffusionXLPipeline.save_lora_weights(folder, unet_lora_layers=layers, **extra)
    return folder


def merged_weights(cache_dir: Path, adapter: str, monkeypatch, *, peft: bool) -> dict[str, torch.Tensor]:
    """The UNet's weights with ``adapter`` merged at scale 0.7, by the direct reader or by PEFT."""
    cache = WarmPipelines(str(cache_dir), device="cpu")
    loaded, _ = cache.get("tiny")
    with monkeypatch.context() as patch:
        if peft:
            patch.setattr(adapter_weights, "read", lambda *a: "the test asks for PEFT's way")
        cache.use_adapter(loaded, adapter, 0.7)
    assert (loaded.merged.peft, loaded.merged.direct) != (set(), {})
    assert bool(loaded.merged.peft) == peft
    return {k: v.detach().clone() for k, v in loaded.pipe.unet.state_dict().items()}


@pytest.mark.parametrize("kind", ["tiny-dora", "lora alpha 8 in its config", "lora without a config"])
def test_the_direct_merge_is_peft_s_merge(cache_dir, tmp_path, monkeypatch, kind):
    """The same weights whichever way an adapter is merged: DoRA's magnitude, a config's alpha
    (scaling alpha / r), a file without one (scaling 1, as diffusers reads it), the job's scale."""
    adapter = kind
    if kind != "tiny-dora":
        metadata = "config" in kind and "without" not in kind
        adapter = str(
            make_lora(tmp_path / "lora", cache_dir / "models" / "tiny", DORA_TARGETS, alpha=8, metadata=metadata)
        )
    direct = merged_weights(cache_dir, adapter, monkeypatch, peft=False)
    through_peft = merged_weights(cache_dir, adapter, monkeypatch, peft=True)
    plain = WarmPipelines(str(cache_dir), device="cpu").get("tiny")[0].pipe.unet.state_dict()
    assert direct.keys() == through_peft.keys()
    changed = [k for k in direct if not torch.equal(direct[k], plain[k])]
    targets = tuple(f"{name}.weight" for name in DORA_TARGETS)
    assert sorted(changed) == sorted(k for k in plain if k.endswith(targets))  # every target, nothing else
    worst = max((direct[k] - through_peft[k]).abs().max().item() for k in direct)
    assert worst < 1e-5


def test_what_the_direct_reader_leaves_to_peft(cache_dir, tmp_path, monkeypatch, caplog):
    """A LoRA on convolutions is PEFT's: it still loads and changes the image, the log says why."""
    folder = make_lora(tmp_path / "conv", cache_dir / "models" / "tiny", ["conv1"], alpha=4, metadata=False)
    cache = WarmPipelines(str(cache_dir), device="cpu")
    plain = render(cache, None)
    with caplog.at_level(logging.INFO, logger="diffq.worker"):
        changed = render(cache, str(folder))
    assert "loaded by PEFT: layer" in caplog.text and "is a Conv2d, not a Linear" in caplog.text
    assert np.abs(changed - plain).mean() > 1.0
    assert np.array_equal(render(cache, None), plain)


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
        WarmPipelines(str(tmp_path), device="cpu")._load(str(tmp_path / "no-model-here"))
