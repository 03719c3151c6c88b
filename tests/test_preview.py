"""The fast preview decoder (issue 81, the VAE's part): ``--decoder`` puts a tiny autoencoder
(TAESD-XL's ``AutoencoderTiny``) in place of an SDXL model's VAE for a job; the decoder is in the
item's key and every image's parameters, a warm worker switches back and forth without a reload,
a decoder that will not load is the worker's trouble (the job given back), one on another family
fails the job in one line. ``tiny-taesd`` is written by the real code and loaded with
``from_pretrained``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import TINY_FLAGS, assert_exactly_once, drain, images_under, producer, write_csv
from PIL import Image

from common.errors import ModelLoadError, PermanentJobError
from common.jobspec import GenParams, PromptItem
from common.naming import item_key
from worker.pipelines import preview
from worker.pipelines.backend import Batch
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)


def test_a_decoder_name_of_no_known_shape_is_refused_with_its_row_and_nothing_is_enqueued(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,decoder\na fox,tiny-taesd\na cat,taesdxl\n")
    done = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out")
    assert done.exit_code != 0 and "Traceback" not in done.output
    assert "p.csv:3: decoder 'taesdxl' is neither a preset (did you mean 'taesdxl-random'?)" in done.output
    assert conn.llen("rq:queue:diffq") == 0


def test_a_decoder_enters_an_items_key_only_when_set():
    item = PromptItem(prompt="a fox", seed=1)
    with_decoder = GenParams(**{**PARAMS.__dict__, "decoder": "tiny-taesd"})
    assert item_key(with_decoder, item) != item_key(PARAMS, item)
    assert "decoder" in with_decoder.record() and with_decoder.record()["decoder"] == "tiny-taesd"


def test_a_warm_worker_decodes_with_the_preview_decoder_and_back_with_its_vae_without_a_reload(cache_dir):
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    loaded, _ = cache.get("tiny")
    made = {}
    for name in (None, "tiny-taesd", None, "tiny-taesd"):
        cache.use_decoder(loaded, name)
        params = GenParams(**{**PARAMS.__dict__, "decoder": name})
        batch = Batch(params=params, prompts=["a red fox"], negatives=[""], seeds=[3], max_batch=1)
        result, _ = cache.generate(loaded, batch)
        image = np.asarray(result.images[0])
        assert image.shape == (64, 64, 3)
        made.setdefault(name, image)
        assert np.array_equal(made[name], image)  # the same decoder gives the same image again
    assert not np.array_equal(made[None], made["tiny-taesd"])  # the other decoder made these pixels
    assert cache.loads == 1 and list(cache.previews._loaded) == ["tiny-taesd"]


def test_a_model_whose_vae_is_compiled_gets_its_preview_decoder_compiled_once_and_the_same_pixels(cache_dir):
    """``compile-vae`` compiles the preview decoder too (TAESD-XL eager was 0.30 s of a 1.26 s job
    of 16 on an H200): once, as one graph (``fullgraph``: a break would fail here), and the graph
    gives the eager decoder's pixels. Dynamo's ``eager`` backend traces it without Inductor's C++."""
    from worker.pipelines.speedups import Speedups

    compiled: list[object] = []

    def compile_module(module):
        compiled.append(module)
        module.compile(backend="eager", fullgraph=True, dynamic=False)

    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    cache.previews.compile_module = compile_module
    loaded, _ = cache.get("tiny")
    params = GenParams(**{**PARAMS.__dict__, "decoder": "tiny-taesd"})
    batch = Batch(params=params, prompts=["a red fox"], negatives=[""], seeds=[3], max_batch=1)
    cache.use_decoder(loaded, "tiny-taesd")
    eager = np.asarray(cache.generate(loaded, batch)[0].images[0])
    assert compiled == []  # a model that runs its VAE eagerly runs the preview decoder eagerly
    loaded.speedups = Speedups(frozenset({"compile-vae"}))
    for _ in range(2):
        cache.use_decoder(loaded, "tiny-taesd")
        assert np.array_equal(np.asarray(cache.generate(loaded, batch)[0].images[0]), eager)
    assert compiled == [cache.previews._loaded["tiny-taesd"].decoder]


def test_a_decoder_that_will_not_load_is_one_line_and_another_family_is_refused(cache_dir, tmp_path):
    decoders = preview.PreviewDecoders("cpu", __import__("torch").float32, str(cache_dir))
    with pytest.raises(ModelLoadError, match=r"^decoder '.*nowhere' cannot be loaded: ") as said:
        decoders.get(str(tmp_path / "nowhere"))
    assert "\n" not in str(said.value)
    flux_like = type("FluxPipeline", (), {})()
    with pytest.raises(PermanentJobError, match="decodes SDXL latents; a FLUX model decodes with its own VAE"):
        preview.use(flux_like, decoders, "tiny-taesd")
    preview.use(flux_like, decoders, None)  # no decoder asked for: nothing to refuse


def test_a_decoder_of_other_latents_fails_the_job_in_one_line_and_writes_nothing(cache_dir, tmp_path):
    """TAESD-XL (8x) on the tiny model (whose VAE upsamples 2x) would make images of another size
    than the row asked for: the batch is refused, not written."""
    from diffusers import AutoencoderTiny

    AutoencoderTiny().save_pretrained(tmp_path / "taesd-8x")
    cache = WarmPipelines(str(cache_dir), device="cpu", speedups="none")
    loaded, _ = cache.get("tiny")
    cache.use_decoder(loaded, str(tmp_path / "taesd-8x"))
    params = GenParams(**{**PARAMS.__dict__, "decoder": str(tmp_path / "taesd-8x")})
    batch = Batch(params=params, prompts=["a red fox"], negatives=[""], seeds=[3], max_batch=1)
    with pytest.raises(PermanentJobError, match="makes 256x256 images where this model's VAE makes 64x64"):
        cache.generate(loaded, batch)


def test_the_random_decoder_has_taesd_xls_architecture():
    """taesdxl-random stands for madebyollin/taesdxl in the GPU benchmarks: diffusers'
    ``AutoencoderTiny`` defaults, 2,445,063 parameters, scaling factor 1 (counted on the meta device)."""
    import torch

    decoder = preview.PreviewDecoders("meta", torch.float16, "/nonexistent").get("taesdxl-random")
    assert sum(p.numel() for p in decoder.parameters()) == 2_445_063 and decoder.config.scaling_factor == 1.0


@pytest.mark.long  # make test: the in-process decoder tests above
@pytest.mark.worker
def test_a_campaign_with_a_preview_decoder_records_it_in_every_image_and_a_rerun_adds_nothing(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,decoder\na red fox,tiny-taesd\na red fox,\n")
    out = tmp_path / "out"
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", out).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 2)
    lines = {
        json.loads(line)["file_name"]: json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()
    }
    assert sorted(str(line["decoder"]) for line in lines.values()) == ["None", "tiny-taesd"]
    for path in images_under(out):
        with Image.open(path) as image:
            assert json.loads(image.text["diffq"])["decoder"] == lines[str(path.relative_to(out))]["decoder"]
    again = producer("enqueue", rows, *TINY_FLAGS, "--output", out)
    assert again.exit_code == 0 and "0 new" in again.output, again.output
    verified = producer("verify", out)
    assert verified.exit_code == 0, verified.output
