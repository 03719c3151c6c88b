"""One CUDA graph per denoiser call shape for any denoiser (``group.py --graph-steps``).

The product's lever, ``cuda-graphs`` (:mod:`worker.pipelines.step_graphs`), graphs SDXL's UNet,
whose calls hold no collective (a CFG pair gathers after the call). This benchmark switch puts the
same class on a FLUX transformer split over ranks too, where the graph captures the compiled
blocks and their NCCL all-to-alls, xDiT's or diffusers' (NCCL allows that under capture), with no
limit on rows. Why by hand: the compiler's own CUDA graphs (``mode="reduce-overhead"``) failed on
2 H100s with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run": the 38 single-stream blocks share one compiled graph, so each replay overwrites the output
the next block reads.

Measured (2 H100s, docs/groups.md): FLUX Ulysses 2 under xDiT went from 2.773 to 2.716 s, one GPU
did not move; under diffusers' split 2.517 and 2.590 s in two calls (2.692 and 3.042 s without).
A process that captured collectives did not exit after its last line (stopped by ``timeout``),
which is why the product's lever stays off the transformer.
"""

from __future__ import annotations

import torch

from worker.pipelines.step_graphs import StepGraphs

#: rows of a FLUX call are images (no CFG batch); every call is graphed
NO_LIMIT = 1 << 30


def install(module: torch.nn.Module) -> StepGraphs | None:
    """Graph ``module``'s calls on a CUDA device; on the CPU nothing changes (returns None)."""
    if not torch.cuda.is_available():
        return None
    return StepGraphs(module, max_rows=NO_LIMIT)
