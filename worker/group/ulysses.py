"""FLUX split over a group's ranks with diffusers' own Ulysses (context parallelism).

Why not xDiT here: xDiT's FLUX attention breaks Dynamo's graph at each all-to-all, so under
``compile-blocks`` a block is several graphs with the layout copies around each exchange left as
kernels of their own. diffusers 0.42's ``enable_parallelism`` splits the same sequence (image and
text tokens with their rotary positions; the output gathered after ``proj_out``) with functional
collectives that Dynamo traces, so a block compiles as one graph. On 2 H100s (one call,
2026-11-27, docs/groups.md) FLUX at 1024² took 2.69 s against xDiT's 2.82 s and one GPU's 3.91 s.

xDiT still splits what this does not take: ring attention, PipeFusion, its parallel VAE, and
Ulysses beside data parallelism (those were measured under xDiT only).

Every rank ends with the whole latent and decodes it (as under xDiT without its parallel VAE);
rank 0 answers with the images.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from worker.group.config import GroupLayout


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


def split(pipe: Any, ulysses_degree: int) -> None:
    """Split ``pipe``'s transformer over the default process group's ranks; every rank calls
    this together, after the model is loaded with its levers (``compile-blocks`` traces on the
    first call, so it compiles the split attention)."""
    from diffusers import ContextParallelConfig

    with _cpu_counts_as_one_device():
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree))
