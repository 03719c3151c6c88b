"""The worker's own VAE decode gives what the SDXL pipeline gives, including for checkpoints
whose VAE config de-normalises latents per channel (``latents_mean``/``latents_std``), and the
same bytes as diffusers' own PIL conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionXLPipeline
from diffusers.image_processor import VaeImageProcessor

from common.jobspec import GenParams
from worker.pipelines.generate import run_batch
from worker.pipelines.models import ensure_tiny
from worker.pipelines.pixels import decode, to_pil

CALL = {"prompt": "a lighthouse at dusk", "width": 64, "height": 64, "num_inference_steps": 3, "guidance_scale": 5.0}


def pipeline_and_ours(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    latents = pipe(**CALL, generator=torch.Generator().manual_seed(1), output_type="latent").images
    expected = pipe(**CALL, generator=torch.Generator().manual_seed(1), output_type="pt").images
    ours = pipe.image_processor.postprocess(decode(pipe, latents), output_type="pt")
    return ours, expected


def test_decode_matches_the_pipeline_with_and_without_latents_mean_and_std(cache_dir):
    pipe = StableDiffusionXLPipeline.from_pretrained(ensure_tiny(cache_dir))
    pipe.set_progress_bar_config(disable=True)
    ours, expected = pipeline_and_ours(pipe)
    assert torch.allclose(ours, expected, atol=1e-5)

    pipe.vae.register_to_config(latents_mean=[0.3, -0.2, 0.1, 0.5], latents_std=[0.7, 1.3, 0.9, 1.1])
    ours_norm, expected_norm = pipeline_and_ours(pipe)
    assert torch.allclose(ours_norm, expected_norm, atol=1e-5)
    assert not torch.allclose(expected_norm, expected, atol=1e-3)  # the fields do change the image


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_to_pil_gives_diffusers_postprocess_byte_for_byte(dtype):
    """Random decodes plus values on every rounding edge (k + 0.5)/255 and past the clamp."""
    image = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 0.8
    edges = (torch.arange(256.0) + 0.5) / 255 * 2 - 1  # denormalizes to exactly (k + 0.5) / 255
    image[0, 0, :8, :32] = edges.view(8, 32)
    image[1, 0, 0, :4] = torch.tensor([-1.5, 1.5, -1.0, 1.0])
    image = image.to(dtype)
    processor = VaeImageProcessor(vae_scale_factor=8)
    expected = processor.postprocess(image, output_type="pil")
    ours = to_pil(processor, image)
    assert [im.mode for im in ours] == [im.mode for im in expected] == ["RGB"] * 3
    for got, want in zip(ours, expected, strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))


def test_a_flux_batch_rounds_its_pixels_where_they_are_to_diffusers_bytes(monkeypatch):
    """FLUX decodes inside its own pipeline call. Asked for PIL images, diffusers copies the batch
    to the host as float32 and rounds it there, on every rank of a group (each holds the whole
    image). The batch asks for the device's pixels and rounds them as :func:`to_pil` does: no
    float copy reaches the host, and the bytes are diffusers' own."""
    from test_speedups import TINY_FLUX

    from worker.pipelines.models import build_flux

    pipe = build_flux(**TINY_FLUX, t5_vocab=None, clip_vocab=None)
    pipe.set_progress_bar_config(disable=True)
    params = GenParams(model="tiny-flux", width=32, height=32, steps=2, guidance=3.5)
    prompts, seeds = ["a red fox in snow", "a lighthouse at dusk"], [7, 8]
    host_floats: list[torch.dtype] = []
    to_numpy = VaeImageProcessor.pt_to_numpy
    monkeypatch.setattr(
        VaeImageProcessor, "pt_to_numpy", staticmethod(lambda x: host_floats.append(x.dtype) or to_numpy(x))
    )
    ours = run_batch(pipe, params, prompts, ["", ""], seeds).images
    assert host_floats == [], "the batch's pixels went to the host as floats"
    expected = pipe(
        prompt=prompts,
        width=32,
        height=32,
        num_inference_steps=2,
        guidance_scale=3.5,
        max_sequence_length=512,
        generator=[torch.Generator("cpu").manual_seed(s) for s in seeds],
        output_type="pil",
    ).images
    assert host_floats  # the check above watches the path diffusers' PIL output takes
    assert [im.mode for im in ours] == ["RGB"] * 2
    for got, want in zip(ours, expected, strict=True):
        assert np.array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("force_upcast", [True, False])
def test_an_oom_inside_decode_leaves_the_vae_in_its_own_dtype(cache_dir, force_upcast):
    """The next batch must find the VAE as the worker set it (fp16), not in the fp32 the failed
    decode switched it to: a worker that splits the batch after an OOM would otherwise decode
    every later batch in fp32, slower and in twice the memory."""
    pipe = StableDiffusionXLPipeline.from_pretrained(ensure_tiny(cache_dir))
    pipe.vae.to(dtype=torch.float16)
    pipe.vae.register_to_config(force_upcast=force_upcast)
    latents = torch.full((1, 4, 8, 8), float("inf") if not force_upcast else 0.0, dtype=torch.float16)
    calls = []

    def out_of_memory(*args, **kwargs):
        calls.append(pipe.vae.dtype)
        raise torch.OutOfMemoryError("CUDA out of memory (test)")

    pipe.vae.decode = out_of_memory
    with pytest.raises(torch.OutOfMemoryError):
        decode(pipe, latents)
    assert calls == [torch.float32] if force_upcast else calls == [torch.float16]
    assert pipe.vae.dtype == torch.float16


def test_the_pixels_reach_pil_in_the_layout_it_keeps_them_so_the_main_thread_copies_nothing(monkeypatch):
    """The device's batch is channels first; PIL keeps rows of RGB. Permuted on the host after the
    copy, every image reached ``Image.fromarray`` as a strided view and Pillow copied it element
    by element on the worker's main thread, which the next job waits for: 108 ms a chunk of 16
    1024² images on a 2-core CI host, against 40 ms when the layout is made where the pixels are
    (on a GPU, one fast kernel) before the copy. Each array PIL gets is already its own layout."""
    from PIL import Image

    from worker.pipelines import pixels

    seen: list[np.ndarray] = []
    fromarray = Image.fromarray
    monkeypatch.setattr(Image, "fromarray", lambda a, *args, **kw: seen.append(a) or fromarray(a, *args, **kw))
    image = torch.rand(2, 3, 16, 24, generator=torch.Generator().manual_seed(5))
    images = pixels.rounded_pil(image)
    assert [im.size for im in images] == [(24, 16)] * 2
    assert len(seen) == 2 and all(a.flags["C_CONTIGUOUS"] for a in seen), [a.strides for a in seen]
    expected = (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert all(np.array_equal(np.asarray(im), want) for im, want in zip(images, expected, strict=True))
