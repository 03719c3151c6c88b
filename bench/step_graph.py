"""One CUDA graph per denoiser call shape, captured by hand (``group.py --graph-steps``).

Why by hand: under an xDiT group the FLUX blocks are compiled between xDiT's all-to-alls (Dynamo
breaks the graph there), and the compiler's own CUDA graphs (``mode="reduce-overhead"``) failed on
2 H100s with "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent
run": the 38 single-stream blocks share one compiled graph, so each replay overwrites the output
the next block reads. Profiles of the 2-GPU call show the ranks waiting on the host that launches
the kernels; one graph for the whole transformer call (compiled blocks, NCCL collectives and all,
which NCCL allows under capture) launches a step with one call. Every rank captures in lockstep,
because every rank runs the same steps.

Inputs are copied into the graph's own buffers before each replay, outputs cloned out of it, so
the pipeline around it sees an ordinary module. Benchmark-only: the product has no such lever.
Measured (2 H100s, docs/groups.md): Ulysses 2 went from 2.773 to 2.716 s, one GPU did not move;
a process that captured collectives did not exit after its last line (stopped by ``timeout``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

#: eager calls on a side stream before capture: the first compiles, the second proves no recompile
WARMUP_CALLS = 2


class StepGraphs:
    """Replaces ``module.forward``; a new input signature (shapes, dtypes, plain values) captures a new graph."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.eager = module.forward
        self.graphs: dict[str, tuple[torch.cuda.CUDAGraph, list[Any], Any]] = {}
        self.replays = 0
        module.forward = self  # type: ignore[method-assign]

    @staticmethod
    def _key(leaves: list[Any], spec: Any) -> str:
        described = [
            (tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves
        ]
        return f"{spec}|{described}"

    def _capture(self, leaves: list[Any], spec: Any) -> tuple[torch.cuda.CUDAGraph, list[Any], Any]:
        args, kwargs = tree_unflatten(leaves, spec)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.eager(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = tree_unflatten(static, spec)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread may query its events while this thread captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self.eager(*args, **kwargs)
        return graph, static, out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        key = self._key(leaves, spec)
        if key not in self.graphs:
            self.graphs[key] = self._capture(leaves, spec)
        graph, static, out = self.graphs[key]
        for mine, given in zip(static, leaves, strict=True):
            if isinstance(mine, torch.Tensor):
                mine.copy_(given)
        graph.replay()
        self.replays += 1
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out)


def install(module: torch.nn.Module) -> StepGraphs | None:
    """Graph ``module``'s calls on a CUDA device; on the CPU nothing changes (returns None)."""
    if not torch.cuda.is_available():
        return None
    return StepGraphs(module)
