"""A batch's initial noise, the numbers diffusers draws, without the join that made the GPU wait.

diffusers' ``randn_tensor`` with one CPU generator per image draws each image's noise as its own
tensor and joins them with ``torch.cat``. On a worker that join ran as an OpenMP team over every
core while the writer's threads encoded the previous batch's PNGs, and the GPU waited for it: it
comes before the first denoiser call. On an H200's 16-core host, a 4-step SDXL batch of 16 at
1024² spent 135.6 ms in that cat with the writer beside it (1.1 ms without), of a 1.01 s call
(``bench/steady_job.py --profile``, 2026-12-04). Here each generator draws into its own rows of
one tensor: the same numbers bit for bit, the same generator states afterwards (an ancestral
sampler's later draws are unchanged), and nothing to join.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def initial_noise(
    generators: Sequence[torch.Generator], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``len(generators)`` images' noise of ``shape`` (one image's, without the batch), image
    ``i`` drawn by ``generators[i]`` on the CPU as diffusers draws it, then moved to ``device``."""
    noise = torch.empty((len(generators), *shape), dtype=dtype)
    for rows, generator in zip(noise.split(1), generators, strict=True):
        torch.randn((1, *shape), generator=generator, dtype=dtype, out=rows)
    return noise.to(device)


def sdxl_latents(pipe: Any, width: int, height: int, generators: Sequence[torch.Generator],
                 dtype: torch.dtype, device: torch.device) -> torch.Tensor:  # fmt: skip
    """The noise ``StableDiffusionXLPipeline.prepare_latents`` would draw for these generators
    (it scales what it is given by the scheduler's initial sigma, as what it draws)."""
    scale = pipe.vae_scale_factor
    channels = pipe.unet.config.in_channels
    return initial_noise(generators, (channels, height // scale, width // scale), dtype, device)
