"""The worker's own VAE decode gives what the SDXL pipeline gives, including for checkpoints
whose VAE config de-normalises latents per channel (``latents_mean``/``latents_std``)."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLPipeline

from worker.pipelines.generate import decode
from worker.pipelines.models import ensure_tiny

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
