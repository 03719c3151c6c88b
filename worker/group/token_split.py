"""FLUX's tokens split over a group's ranks with diffusers' own context parallelism.

Two ways, each over every rank of the group and nothing beside it:
- **Ulysses** (``--ulysses-degree N``): every rank sends the other ranks their share of its
  tokens' query, key and value heads, attends to all tokens for its heads, and sends the output
  back (four all-to-alls per attention layer).
- **Ring** (``--ring-degree N``): every rank keeps its tokens' queries and gathers the others'
  keys and values while it attends to its own, then to theirs, and merges the two softmaxes by
  their log-sum-exp (:mod:`worker.group.ring_attention`; diffusers' split still cuts the tokens
  and gathers the output). The gather is issued as soon as the keys and values exist and waited
  for only where the peers' part is used (Inductor's ``raise_comms`` and ``sink_waits`` passes:
  by default the compiled block issues it after the local attention, read in its output code on
  2 CPU ranks). The merge needs an attention that returns the log-sum-exp: cuDNN's, so a ring
  group needs CUDA GPUs.

Measured on 2 H100s (FLUX 1024², 28 steps, each transformer call one CUDA graph; docs/groups.md):
one GPU 4.009 s; Ulysses 2.581 s (1.55×); diffusers' ring with cuDNN's attention and the gather
overlapped 2.513 s (1.60×), with the flash kernel 2.850 s, 2.929 s without the overlap
(``h100x2-fluxring-call.jsonl``); in a later call one GPU 3.894 s, diffusers' ring 2.458 s and
this ring's own attention 2.416 s (1.61×, ``h100x2-fluxring4-call.jsonl``). On 4 H100s Ulysses
was the faster: 1.490 s against diffusers' ring's 1.687 s (one GPU 3.927 s), and our ring of 4
made 1.602 s in a later call (one GPU 4.019 s): a ring rank of 4 gathers three peers' keys and
values behind a quarter of the attention.

Why diffusers' split and not xDiT's (2 H100s, 2026-11-27): per image, the all-to-alls took
0.30 s of kernel time against xDiT's 0.56 s on the rank that waited least, and a block compiles
as one graph with its collectives inside. xDiT still splits what this does not take:
PipeFusion, its parallel VAE, Ulysses beside ring, and either beside data parallelism.

Every rank ends with the whole latent; the ranks decode it together, each its rows
(:mod:`worker.group.split_decode`, installed by the engine), and rank 0 answers with the images. The split
is exact: the text tokens and each job's image tokens must divide by the degree, and for
Ulysses the attention heads too. The first are checked when the group starts, the image tokens
when a job comes (a size that does not split is that job's permanent failure, with the sizes
that do).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from common.errors import ConfigError, PermanentJobError
from worker.group.config import GroupLayout
from worker.pipelines.families.flux import TEXT_TOKENS as FLUX_TEXT_TOKENS

#: where a ring's attention runs: cuDNN's, which returns the log-sum-exp the merge needs
#: (worker/group/ring_attention.py; the tests put its CPU twin in for it). diffusers' flash
#: kernel made the same ring 2.850 s where cuDNN's made 2.513 s (2 H100s, FLUX 1024²)
RING_DEVICES = frozenset({"cuda"})


def takes(layout: GroupLayout) -> tuple[str, int] | None:
    """``("ulysses" | "ring", degree)`` when this split serves ``layout`` (one of the two over
    every rank, nothing else), else None (xDiT's)."""
    if layout.pipefusion_degree > 1 or layout.data_parallel_degree > 1 or layout.parallel_vae or layout.cfg_parallel:
        return None
    if layout.ulysses_degree > 1 and layout.ring_degree == 1:
        return "ulysses", layout.ulysses_degree
    if layout.ring_degree > 1 and layout.ulysses_degree == 1:
        return "ring", layout.ring_degree
    return None


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


def _overlap_gathers() -> None:
    """Inductor issues each collective as early as its input allows and waits where its result
    is first used, so a ring block's local attention runs while the peers' keys and values come.
    Process-wide: it reorders only graphs that hold collectives, and a group's process compiles
    no others that do."""
    import torch._inductor.config as inductor_config

    inductor_config.reorder_for_compute_comm_overlap = True
    inductor_config.reorder_for_compute_comm_overlap_passes = ["sink_waits", "raise_comms"]


def _check_ring_device(device: torch.device, flag: str, degree: int) -> None:
    """Stop at start, not in the first job, where cuDNN's attention cannot run."""
    if device.type not in RING_DEVICES:
        here = f"{device.type} machine"
    elif device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        here = "GPU (compute capability {}.{})".format(*torch.cuda.get_device_capability(device))
    else:
        return
    raise ConfigError(
        f"{flag}: the ring merges its attention with cuDNN's, which needs CUDA GPUs (compute capability 8.0 or "
        f"later); on this {here} use --ulysses-degree {degree}"
    )


def split(pipe: Any, way: str, degree: int, model: str) -> None:
    """Split ``pipe``'s transformer ``way`` ("ulysses" or "ring") over the default process
    group's ``degree`` ranks; every rank calls this together, after the model is loaded with its
    levers (``compile-blocks`` traces on the first call, so it compiles the split attention)."""
    from diffusers import ContextParallelConfig

    flag = f"--{way}-degree {degree}"
    counts = [(FLUX_TEXT_TOKENS, "text tokens per prompt")]
    if way == "ulysses":
        counts.insert(0, (pipe.transformer.config.num_attention_heads, "attention heads"))
    for count, what in counts:
        if count % degree:
            divides = " and ".join(str(c) for c, _ in counts)
            raise ConfigError(
                f"{flag}: {model} has {count} {what}, which do not split over {degree} ranks; "
                f"use a degree that divides {'both ' if len(counts) > 1 else ''}{divides}"
            )
    if way == "ring":
        _check_ring_device(pipe.transformer.device, flag, degree)
        _overlap_gathers()
        config = ContextParallelConfig(ring_degree=degree)
    else:
        config = ContextParallelConfig(ulysses_degree=degree)
    with _cpu_counts_as_one_device():
        pipe.transformer.enable_parallelism(config=config)
    if way == "ring":
        _ring_attention(pipe)


def _ring_attention(pipe: Any) -> None:
    """Every attention of the transformer attends as a ring over all ranks (diffusers' split
    still cuts the tokens and gathers the output)."""
    import torch.distributed as dist

    from worker.group.ring_attention import RingAttention

    pipe.transformer.set_attn_processor(RingAttention(dist.group.WORLD))


def check_size(pipe: Any, way: str, degree: int, width: int, height: int) -> None:
    """Refuse a job whose image tokens do not split over the ranks (FLUX packs 2×2 latent pixels
    into one token), before any rank computes."""
    side = pipe.vae_scale_factor * 2
    tokens = (width // side) * (height // side)
    if tokens % degree:
        raise PermanentJobError(
            f"{width}x{height} makes {tokens} image tokens ({width // side}x{height // side}), which do not "
            f"split over this group's {degree} {way.capitalize()} ranks; use a width and height whose "
            f"tokens divide by {degree} (1024x1024 makes 4096), or a queue of single-GPU workers"
        )
