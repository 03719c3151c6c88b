"""FLUX split over a group's ranks with diffusers' own Ulysses (context parallelism).

diffusers 0.42's ``enable_parallelism`` splits the sequence (image and text tokens with their
rotary positions; the output gathered after ``proj_out``) with functional collectives that
Dynamo traces: a block compiles as one graph with its all-to-alls inside. Why not xDiT's split
here (2 H100s, 2026-11-27, docs/groups.md): per image, the all-to-alls took 0.30 s of kernel
time against xDiT's 0.56 s on the rank that waited least, and the elementwise kernels 0.17 s
against 0.31 s; FLUX at 1024² took 2.62 and 2.69 s against xDiT's 2.84 and 2.82 s in two calls,
3.04 against 2.86 s in a third whose runs were all slower and spread by up to 0.4 s. With one
CUDA graph per transformer call (a benchmark switch) it took 2.52-2.59 s, the fastest measured.

xDiT still splits what this does not take: ring attention, PipeFusion, its parallel VAE, and
Ulysses beside data parallelism (those were measured under xDiT only).

Every rank ends with the whole latent and decodes it (as under xDiT without its parallel VAE);
rank 0 answers with the images.

diffusers' split is exact: the heads, the text tokens and each job's image tokens must divide by
the degree (else it fails inside the first step). The first two are checked when the group
starts, the image tokens when a job comes (a size that does not split is that job's permanent
failure, with the sizes that do).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from common.errors import ConfigError, PermanentJobError
from worker.group.config import GroupLayout
from worker.pipelines.generate import FLUX_TEXT_TOKENS


def takes(layout: GroupLayout) -> bool:
    """Whether this split serves ``layout``: Ulysses over every rank and nothing else."""
    return (
        layout.ulysses_degree > 1
        and layout.ring_degree == 1
        and layout.pipefusion_degree == 1
        and layout.data_parallel_degree == 1
        and not layout.parallel_vae
        and not layout.cfg_parallel
    )


@contextmanager
def _cpu_counts_as_one_device() -> Iterator[None]:
    """diffusers 0.42.1 places a rank on ``rank % torch.accelerator.device_count()``, which
    divides by zero on a machine without an accelerator (the CPU groups of the tests). There the
    device is the CPU whatever the rank, so the count reads 1 while the split is set up."""
    count = torch.accelerator.device_count
    if count() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = count  # type: ignore[assignment]


def split(pipe: Any, ulysses_degree: int, model: str) -> None:
    """Split ``pipe``'s transformer over the default process group's ranks; every rank calls
    this together, after the model is loaded with its levers (``compile-blocks`` traces on the
    first call, so it compiles the split attention)."""
    from diffusers import ContextParallelConfig

    heads = pipe.transformer.config.num_attention_heads
    for count, what in ((heads, "attention heads"), (FLUX_TEXT_TOKENS, "text tokens per prompt")):
        if count % ulysses_degree:
            raise ConfigError(
                f"--ulysses-degree {ulysses_degree}: {model} has {count} {what}, which do not split over "
                f"{ulysses_degree} ranks; use a degree that divides both {heads} and {FLUX_TEXT_TOKENS}"
            )
    with _cpu_counts_as_one_device():
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree))


def check_size(pipe: Any, ulysses_degree: int, width: int, height: int) -> None:
    """Refuse a job whose image tokens do not split over the ranks (FLUX packs 2×2 latent pixels
    into one token), before any rank computes."""
    side = pipe.vae_scale_factor * 2
    tokens = (width // side) * (height // side)
    if tokens % ulysses_degree:
        raise PermanentJobError(
            f"{width}x{height} makes {tokens} image tokens ({width // side}x{height // side}), which do not "
            f"split over this group's {ulysses_degree} Ulysses ranks; use a width and height whose "
            f"tokens divide by {ulysses_degree} (1024x1024 makes 4096), or a queue of single-GPU workers"
        )
