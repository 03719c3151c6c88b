"""Where a pipeline's weights live: on the GPU, or on the CPU and moved in as they are needed.

An SDXL pipeline in fp16 is 6.6 GB of weights (UNet 5.1 GB, the two text encoders 1.6 GB, VAE
0.2 GB) before a single image is made, so a GPU of 8 GB cannot hold it resident with a batch.
diffusers' two offloads trade speed for memory (figures: docs/benchmarks.md):

- ``model``: every component sits in CPU memory and is moved whole to the GPU when its turn
  comes (text encoders, then the UNet for all steps, then the VAE): the GPU holds the largest
  component plus a batch; about 0.7 s more per image at 1024² on an H100's PCIe.
- ``sequential``: each layer's weights are streamed in for each call: about 4 GB at 1024², and
  15-18x slower than ``model``; for GPUs too small for the UNet.

``auto`` (the default) keeps everything on the GPU when the pipeline and a batch of two fit,
else takes ``model``, else ``sequential``: measured, not guessed (worker/pipelines/memory.py).
Compiled graphs are not used with an offload: accelerate's hooks move weights inside
``forward`` and run outside torch.compile (``torch.compiler.disable``), which a whole-UNet
``fullgraph`` compile cannot trace (measured: ``Unsupported: Skip calling
torch.compiler.disable()d function``); the log says so when it drops them. A compile that
allows the graph break at the hook was 25 % faster under model offload on an H100, but every
adapter load takes the hooks off and puts new ones on, which would recompile the UNet: not
used yet (docs/benchmarks.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

log = logging.getLogger("diffq.worker")

#: levers that do not combine with an offload (see the module's docstring); fp8 keeps a second
#: UNet and quantized tensors that accelerate's hooks do not know how to move; cuda-graphs and
#: encoder-graphs replay the weights' addresses of their capture, which an offload moves;
#: modulation-once computes its table in a hook that runs before accelerate's moves the weights in
NOT_WITH_OFFLOAD = frozenset(
    {
        "compile-blocks",
        "compile-unet",
        "compile-vae",
        "cuda-graphs",
        "encoder-graphs",
        "fp8",
        "modulation-once",
    }
)


def components(pipe: Any) -> dict[str, torch.nn.Module]:
    return {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def module_bytes(module: torch.nn.Module) -> int:
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def weights_bytes(pipe: Any) -> int:
    """Bytes of every component's weights: what ``none`` keeps on the GPU."""
    return sum(module_bytes(c) for c in components(pipe).values())


def place(pipe: Any, mode: str, device: torch.device) -> None:
    """Put ``pipe`` where ``mode`` says (from wherever it is now, hooks removed first)."""
    pipe.remove_all_hooks()
    if mode == "none":
        pipe.to(device)
    elif mode == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif mode == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:
        raise ValueError(f"offload mode {mode!r}")
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextmanager
def weights_in_place(pipe: Any, mode: str, device: torch.device) -> Iterator[None]:
    """The hooks off while the body changes the weights (loading or merging an adapter), then
    back on, reading the changed weights. Sequential offload keeps each layer's weights aside and
    leaves placeholders on the ``meta`` device, which a merge cannot change; and diffusers'
    ``load_lora_weights`` re-enables an offload it finds on its default device, not the worker's."""
    if mode == "none":
        yield
        return
    pipe.remove_all_hooks()
    try:
        yield
    finally:
        place(pipe, mode, device)
