"""A fast preview decoder, opt-in per job (``--decoder``): a tiny autoencoder (TAESD-XL, diffusers'
``AutoencoderTiny``) in place of the model's VAE for SDXL-family models.

At 4 steps the VAE is the largest part of an SDXL job on the GPU (0.69 s of a 1.66 s job of 16 on
an H200, docs/benchmarks.md): TAESD-XL decodes the same latents with a small fraction of its work.
Its images are previews, not the VAE's (softer, its own small errors), so the decoder is a
generation parameter: it enters an item's key and every image's metadata, and a dataset says
which images had it.

A decoder is a hub id (``madebyollin/taesdxl``), a local diffusers folder, or a preset:
``taesdxl-random`` (TAESD-XL's architecture with random weights: its FLOPs, for the benchmarks)
or ``tiny-taesd`` (toy widths, written to the cache once and loaded with ``from_pretrained``, for
the tests). It takes the denoiser's latents as they are: ``AutoencoderTiny``'s scaling factor
is 1, the one diffusers' pipelines divide by before they call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from common.errors import ModelLoadError, PermanentJobError
from worker.pipelines import models
from worker.pipelines.families import family_of
from worker.pipelines.pixels import PREVIEW_ATTR

log = logging.getLogger("diffq.worker")

#: the families whose latents a TAESD-XL decodes (4 SDXL latent channels)
FAMILIES = frozenset({"SDXL"})
#: the tests' decoder: toy widths, two levels (one 2x upsampling, as the ``tiny`` model's VAE;
#: the real one has four levels of 64 channels, 8x)
TINY_TAESD: dict[str, Any] = {
    "encoder_block_out_channels": (8, 8),
    "decoder_block_out_channels": (8, 8),
    "num_encoder_blocks": (1, 1),
    "num_decoder_blocks": (1, 1),
}
TINY_TAESD_SEED = 20261203


def compile_lazily(module: torch.nn.Module) -> None:
    """One static graph, traced at the first call (Inductor's on-disk cache keeps the kernels)."""
    module.compile(fullgraph=True, dynamic=False)


class PreviewDecoders:
    """The preview decoders this worker loaded, by name, on its device and in its dtype.

    A model served with ``compile-vae`` has its preview decoder compiled too (``compiled`` in
    :meth:`get`): eager, TAESD-XL's 64-channel convolutions at full resolution are separate
    passes over 1024² activations with a ReLU and an add between them, the job's largest part
    after the denoise at 4 steps (0.30 s a job of 16 on an H200). The compile is lazy and small
    (one graph of a 2.4 M-parameter decoder), so it is not kept as a file as the UNet's is."""

    def __init__(
        self,
        device: Any,
        dtype: torch.dtype,
        cache_dir: str,
        compile_module: Callable[[torch.nn.Module], None] = compile_lazily,
    ) -> None:
        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        self.dtype = dtype
        self.cache_dir = cache_dir
        self.compile_module = compile_module
        self._loaded: dict[str, Any] = {}
        self._compiled: set[str] = set()

    def get(self, name: str, compiled: bool = False) -> Any:
        """The decoder ``name``, loaded the first time, its decoder compiled the first time a
        ``compiled`` caller asks (and compiled from then on: the graph computes the same
        decode); one that cannot load is a :class:`~common.errors.ModelLoadError` in one line
        (the job function gives the job back for other workers, as for a model)."""
        if name not in self._loaded:
            try:
                decoder = self._load(name)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
                raise ModelLoadError(f"decoder {name!r} cannot be loaded: {first}") from None
            self._loaded[name] = decoder.requires_grad_(False).eval()
            log.info("preview decoder %s loaded", name)
        if compiled and name not in self._compiled:
            self.compile_module(self._loaded[name].decoder)
            self._compiled.add(name)
            log.info("preview decoder %s compiled (compile-vae)", name)
        return self._loaded[name]

    def _load(self, name: str) -> Any:
        from diffusers import AutoencoderTiny

        if name == "taesdxl-random":
            with models.drawn(TINY_TAESD_SEED, self.dtype, self.device):
                return AutoencoderTiny()
        source = ensure_tiny_taesd(self.cache_dir) if name == "tiny-taesd" else name
        return AutoencoderTiny.from_pretrained(source, torch_dtype=self.dtype).to(self.device)


def use(pipe: Any, decoders: PreviewDecoders, name: str | None, compiled: bool = False) -> None:
    """Make ``name`` the decoder of ``pipe``'s next batches (None: the model's own VAE), compiled
    where the model's VAE is. Only a family whose latents it decodes takes one: on any other the
    job fails at once, in one line."""
    if name is None:
        pipe.__dict__.pop(PREVIEW_ATTR, None)
        return
    family = family_of(pipe).title
    if family not in FAMILIES:
        raise PermanentJobError(
            f"decoder {name!r} decodes SDXL latents; a {family} model decodes with its own VAE: drop --decoder"
        )
    setattr(pipe, PREVIEW_ATTR, decoders.get(name, compiled))


def ensure_tiny_taesd(cache_dir: str | Path) -> Path:
    """``tiny-taesd``: an ``AutoencoderTiny`` of toy widths with random weights, written once."""
    from diffusers import AutoencoderTiny

    def write(folder: Path) -> None:
        torch.manual_seed(TINY_TAESD_SEED)
        AutoencoderTiny(**TINY_TAESD).save_pretrained(folder)

    return models.write_once(Path(cache_dir) / "decoders" / "tiny-taesd", write)
