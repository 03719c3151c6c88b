"""``cuda-graphs``: the UNet's calls replayed as one CUDA graph per input shape.

Why: at batch 1 an H100 finishes SDXL's UNet kernels faster than one CPU thread launches them
(about 1,700 per step). Measured with this lever on H100s (docs/groups.md): one image with the
single worker's levers took 1.251 s, 1.078 s with it; a 2-GPU CFG pair, where each rank launches
the same kernels for half the rows, took 1.460 s without graphs (an earlier call) and 0.703 s
with them. At batch 8 the GPU is the limit and graphs gave nothing (−0.9 %), so calls above
:data:`MAX_ROWS` rows run as before and hold no graph memory.

Why by hand rather than ``torch.compile(mode="reduce-overhead")``: the UNet's compiled graph
comes from a precompiled file (:mod:`worker.pipelines.precompiled`), which the compiler's own
CUDA graphs do not wrap, and a 2-GPU process whose compiled graphs ran under them did not exit
after its last call. Here one graph records whatever the UNet's forward launches (compiled or
not); a CFG pair's exchange stays outside it (the pair gathers after the UNet call).

A FLUX group split with Ulysses or ring graphs its whole transformer call, the NCCL
collectives inside (Ulysses: 2.58 against 2.70 s per image on 2 H100s, docs/groups.md). Such a graph holds NCCL's
communicators: :func:`release` drops the graphs before the group leaves its process group, else
the process did not exit.

``encoder-graphs`` does the same for the text encoders' calls (SDXL's two CLIPs, FLUX's CLIP and
T5): a prompt's encode is the host launching about a thousand small kernels whose arithmetic an
H200 finishes in a fraction of the time (SDXL's one prompt: 37.3 ms eager, 9.2 ms graphed;
FLUX's T5 keeps the GPU busy: 33.6 and 27.0 ms; docs/groups.md), and every rank of a group
encodes its prompts whole. Their calls always have the same shape (padded
to the tokenizer's length), so one graph per batch size serves every prompt.

A graph replays the memory it was captured with: inputs are copied into its own buffers before
each replay and its outputs cloned out, so the pipeline sees an ordinary module. diffq's own
merges write weights in place, which a replay reads; a PEFT merge may give a weight new memory,
which it would not, so :func:`reset` drops, after a switch, the graphs of every module that
holds a layer an adapter has changed (the next call captures again: two warm calls and a
capture, well under a second at batch 1); a UNet-only adapter leaves the encoders' graphs.
The memory probe runs without graphs (:func:`paused`): a probe's batch sizes are not the job's.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

log = logging.getLogger("diffq.worker")

#: calls of more rows than this run without a graph: batch 4 with CFG; the host is the limit
#: only below it (batch 8, 16 rows: −0.9 % with graphs, and the graph's memory held for nothing)
MAX_ROWS = 8
#: graphs one module keeps at most: a worker runs one batch size per image size (tails are padded
#: to it); a call that varies a plain value every step (a timestep given as a float) would
#: otherwise capture a graph, and hold its memory, per step
MAX_GRAPHS = 4
#: eager calls on a side stream before a capture: the first may compile or load a precompiled
#: file, the second runs what the capture will record (cuBLAS and cuDNN have picked their kernels)
WARMUP_CALLS = 2


class StepGraphs:
    """Stands in for ``module.forward``; a new input signature (shapes, dtypes, plain values)
    captures a new graph. The three methods at the bottom are the CUDA calls (tests replace them)."""

    def __init__(self, module: torch.nn.Module, max_rows: int = MAX_ROWS, lever: str = "cuda-graphs") -> None:
        self.eager = module.forward
        self.owner = module
        self.name = _name(module)
        self.lever = lever  # what the log lines name
        self.max_rows = max_rows
        self.graphs: dict[str, tuple[Any, list[Any], Any]] = {}
        self.captures = 0
        self.replays = 0
        self.paused = False
        self.broken = False  # a capture failed: this module runs without graphs from then on
        self.full = False  # MAX_GRAPHS reached (said once)
        module.forward = self  # type: ignore[method-assign]

    def reset(self) -> None:
        """Drop every graph (the weights they read may have moved); the next call captures."""
        self.graphs.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        rows = next((x.shape[0] for x in leaves if isinstance(x, torch.Tensor) and x.dim() > 0), 0)
        if self.paused or self.broken or rows > self.max_rows:
            return self.eager(*args, **kwargs)
        key = _key(leaves, spec)
        if key not in self.graphs:
            if len(self.graphs) >= MAX_GRAPHS:
                if not self.full:
                    self.full = True
                    log.warning(
                        "%s: %s was called with more than %d shapes; calls of new shapes run without CUDA graphs",
                        self.lever,
                        self.name,
                        MAX_GRAPHS,
                    )
                return self.eager(*args, **kwargs)
            try:
                self.graphs[key] = self._capture(leaves, spec)
            except torch.OutOfMemoryError:
                raise  # the batch is too big, not the graph: the job's OOM handling halves it
            except Exception as exc:
                self.broken = True
                self.graphs.clear()
                log.warning(
                    "%s: capturing %s's call failed (%s: %s); this worker runs it without CUDA graphs",
                    self.lever,
                    self.name,
                    type(exc).__name__,
                    str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "",
                )
                return self.eager(*args, **kwargs)
            self.captures += 1
        graph, static, out = self.graphs[key]
        for mine, given in zip(static, leaves, strict=True):
            if isinstance(mine, torch.Tensor):
                mine.copy_(given)
        self._replay(graph)
        self.replays += 1
        return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, out)

    def _capture(self, leaves: list[Any], spec: Any) -> tuple[Any, list[Any], Any]:
        args, kwargs = tree_unflatten(leaves, spec)
        self._warm(args, kwargs)
        static = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        args, kwargs = tree_unflatten(static, spec)
        graph, out = self._record(args, kwargs)
        return graph, static, out

    # -- the CUDA calls ------------------------------------------------------------------------

    def _warm(self, args: tuple, kwargs: dict) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_CALLS):
                self.eager(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)

    def _record(self, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        graph = torch.cuda.CUDAGraph()
        # thread_local: the worker's other threads (heartbeats, metrics, the PNG writer) may
        # call into CUDA while this one captures; their calls are theirs, not the graph's
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = self.eager(*args, **kwargs)
        return graph, out

    def _replay(self, graph: Any) -> None:
        graph.replay()


def _name(module: torch.nn.Module) -> str:
    """What the log calls the graphed module."""
    kind = type(module).__name__
    if "UNet" in kind:
        return "the UNet"
    if "Text" in kind or "Encoder" in kind:  # CLIPTextModel(WithProjection), T5EncoderModel
        return f"the text encoder ({kind})"
    return "the transformer"


def _key(leaves: list[Any], spec: Any) -> str:
    described = [
        (tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves
    ]
    return f"{spec}|{described}"


def install(module: torch.nn.Module, max_rows: int = MAX_ROWS, lever: str = "cuda-graphs") -> StepGraphs | None:
    """Graph ``module``'s calls where it runs on a CUDA device; elsewhere nothing changes (None)."""
    weight = next(module.parameters(), None)
    if weight is None or weight.device.type != "cuda":
        log.info("speedups: %s needs %s on a CUDA GPU; this one runs without them", lever, _name(module))
        return None
    return StepGraphs(module, max_rows=max_rows, lever=lever)


#: the pipeline attributes ``encoder-graphs`` graphs: SDXL's two CLIPs; FLUX's CLIP and T5
ENCODERS = ("text_encoder", "text_encoder_2")


def install_encoders(pipe: Any) -> list[StepGraphs]:
    """``encoder-graphs``: graph each of ``pipe``'s text encoders (where on a CUDA device)."""
    modules = [getattr(pipe, name, None) for name in ENCODERS]
    graphs = [install(m, lever="encoder-graphs") for m in modules if isinstance(m, torch.nn.Module)]
    return [g for g in graphs if g is not None]


def installed(pipe: Any) -> StepGraphs | None:
    """The graphs standing in for ``pipe``'s denoiser (a UNet, also under a CFG pair's split
    forward, or a FLUX group's transformer), if any."""
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    forward = getattr(denoiser, "forward", None)
    if isinstance(forward, StepGraphs):
        return forward
    inner = getattr(forward, "graphs", None)  # the CFG pair's split_forward names what it wraps
    return inner if isinstance(inner, StepGraphs) else None


def every(pipe: Any) -> list[StepGraphs]:
    """All of ``pipe``'s graphs: its denoiser's and its text encoders'."""
    encoders = [getattr(getattr(pipe, name, None), "forward", None) for name in ENCODERS]
    return [g for g in (installed(pipe), *encoders) if isinstance(g, StepGraphs)]


def release(pipe: Any) -> bool:
    """Drop ``pipe``'s graphs for good, before its process leaves its process group: a graph
    that captured NCCL's collectives holds their communicators, and a 2-H100 process that
    destroyed its group with such graphs alive did not exit (stopped by ``timeout``); with them
    dropped first it exited 5 s after its last call. Returns whether there were graphs."""
    found = every(pipe)
    for graphs in found:
        graphs.paused = True
        graphs.reset()
    if found:
        gc.collect()
    return bool(found)


def reset(pipe: Any, touched: Iterable[torch.nn.Module] | None = None) -> None:
    """After a switch of adapter: a graph reads its weights' old memory, so the graphs of every
    module that holds one of ``touched`` (the layers adapters have changed; None: all) capture
    again. A UNet-only adapter leaves the text encoders' graphs as they are."""
    wanted = None if touched is None else {id(layer) for layer in touched}
    for graphs in every(pipe):
        if wanted is None or any(id(layer) in wanted for layer in graphs.owner.modules()):
            graphs.reset()


@contextlib.contextmanager
def paused(pipe: Any) -> Iterator[None]:
    """Run ``pipe`` without graphs inside (the memory probe's batch sizes are not the job's)."""
    found = every(pipe)
    was = [graphs.paused for graphs in found]
    for graphs in found:
        graphs.paused = True
    try:
        yield
    finally:
        for graphs, state in zip(found, was, strict=True):
            graphs.paused = state
