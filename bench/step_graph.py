"""One CUDA graph per denoiser call shape for any denoiser (``group.py --graph-steps``).

The product's lever, ``cuda-graphs`` (:mod:`worker.pipelines.step_graphs`), graphs SDXL's UNet
and a FLUX Ulysses or ring group's transformer. This benchmark switch puts the same class on a
transformer under any split (xDiT's too), where the graph captures the compiled
blocks and their NCCL all-to-alls, xDiT's or diffusers' (NCCL allows that under capture), with no
limit on rows. Why by hand: the compiler's own CUDA graphs (``mode="reduce-overhead"``) failed on
2 H100s with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run": the 38 single-stream blocks share one compiled graph, so each replay overwrites the output
the next block reads.

Measured (2 H100s, docs/groups.md): FLUX Ulysses 2 under xDiT went from 2.773 to 2.716 s, one GPU
did not move; under diffusers' split 2.517 and 2.590 s in two calls (2.692 and 3.042 s without).
A process that captured collectives did not exit after its last line (stopped by ``timeout``)
until the graphs were dropped before the process group (``step_graphs.release``); since then a
FLUX Ulysses or ring group takes the product's lever itself, and this switch is for other splits.
"""

from __future__ import annotations

import torch

from worker.group.engine import ALL_ROWS
from worker.pipelines import step_graphs


def install(module: torch.nn.Module) -> step_graphs.StepGraphs | None:
    """Graph every call of ``module`` on a CUDA device, as a Ulysses or ring group now does for FLUX;
    elsewhere nothing changes (returns None)."""
    return step_graphs.install(module, ALL_ROWS)
