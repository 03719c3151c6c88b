"""bench/quality.py, the script a user runs before a campaign to see what ``--precision fp8``
costs on their own model: run here end to end on two folders of PNGs that carry their prompts
(as a worker writes them), with a small random CLIP model saved and loaded the way a real one
is, so its CLIP score and feature-distance path runs, not only its pixel measures."""

from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pytest
from conftest import ROOT
from PIL import Image
from PIL.PngImagePlugin import PngInfo


@pytest.fixture
def quality(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "bench" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def write_run(folder, noise: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(99).integers(0, 256, (64, 64, 3))
    for i in range(6):
        info = PngInfo()
        info.add_itxt("prompt", f"a red fox number {i}")
        pixels = np.clip(base + i * 20 + rng.normal(0, noise, base.shape), 0, 255).astype(np.uint8)
        path = folder / "images" / f"{i:02d}" / f"img{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path, pnginfo=info)


def tiny_clip(folder) -> str:
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    from worker.pipelines.models import byte_tokenizer

    tokenizer = byte_tokenizer()
    config = CLIPConfig(
        text_config={"vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "max_position_embeddings": 77,
                     "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        projection_dim=16,
    )  # fmt: skip
    CLIPModel(config).save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(folder)
    return str(folder)


def test_identical_runs_measure_as_identical(quality, tmp_path):
    write_run(tmp_path / "a", noise=0)
    write_run(tmp_path / "b", noise=0)
    record = quality.measure(tmp_path / "a", tmp_path / "b")
    assert record["images"] == 6 and record["identical_images"] == 6 and record["max_abs_diff"] == 0
    assert record["ssim_mean"] == pytest.approx(1.0)


def test_a_noisier_run_scores_lower_and_clip_measures_run(quality, tmp_path):
    write_run(tmp_path / "ref", noise=0)
    write_run(tmp_path / "near", noise=2, seed=1)
    write_run(tmp_path / "far", noise=25, seed=2)
    clip = tiny_clip(tmp_path / "clip")
    near = quality.measure(tmp_path / "ref", tmp_path / "near", clip=clip)
    far = quality.measure(tmp_path / "ref", tmp_path / "far", clip=clip)
    assert near["psnr_mean_db"] > far["psnr_mean_db"] + 10 and near["ssim_mean"] > far["ssim_mean"]
    assert 0 <= near["clip_score_candidate"] <= 100 and near["clip_score_reference"] == far["clip_score_reference"]
    assert math.isfinite(near["fd_clip_features"]) and far["fd_clip_features"] > near["fd_clip_features"]


def test_runs_without_a_common_image_are_one_clear_error(quality, tmp_path):
    write_run(tmp_path / "a", noise=0)
    (tmp_path / "b").mkdir()
    with pytest.raises(SystemExit, match=r"no image of .* has a namesake"):
        quality.measure(tmp_path / "a", tmp_path / "b")
