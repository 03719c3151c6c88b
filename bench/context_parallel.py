"""diffusers' own context parallelism (Ulysses) for FLUX: a benchmark alternative to xDiT's split.

Why it is worth a call: xDiT's FLUX attention breaks Dynamo's graph at its all-to-alls (see
``worker/pipelines/speedups.py``), so under ``compile-blocks`` every block is several graphs and
the layout copies around each exchange run as kernels of their own (on 2 H100s FLUX at 1024²
makes 1.45× one GPU, where the issue asks 1.7×). diffusers 0.42's ``enable_parallelism`` splits
the same sequence (image and text tokens, and their rotary positions, over the ranks; the
output gathered after ``proj_out``) with functional collectives that Dynamo traces: a FLUX
block compiles with ``fullgraph=True`` (``tests/test_context_parallel.py``), so Inductor can fuse
those copies into the kernels around them, and with ``bench/group.py --comm-overlap`` move
compute between an all-to-all and its wait. Whether that is faster on H100s is for
``bash bench/group_device.sh fluxprofile`` to measure; the product's groups still split with xDiT.

Every rank ends with the whole image (the gather is before the decoder), as under xDiT without
its parallel VAE.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


@contextmanager
def _cpu_counts_as_one_device() -> Iterator[None]:
    """diffusers 0.42.1 places a rank on ``rank % torch.accelerator.device_count()``, which
    divides by zero on a machine without an accelerator (the CPU tests). There the device is the
    CPU whatever the rank, so the count is taken as 1 while the split is set up."""
    count = torch.accelerator.device_count
    if count() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.accelerator.device_count = count  # type: ignore[assignment]


def install(pipe: Any, ulysses_degree: int) -> None:
    """Split ``pipe``'s transformer over the default process group's ranks (all of them, in
    Ulysses); every rank calls this together, after the model is loaded and its levers applied
    (``compile-blocks`` traces lazily, so it compiles the split attention)."""
    from diffusers import ContextParallelConfig

    transformer = getattr(pipe, "transformer", None)
    if transformer is None:
        raise SystemExit("--diffusers-cp splits a DiT's transformer (FLUX); this pipeline has none")
    with _cpu_counts_as_one_device():
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=ulysses_degree))
