"""Pipeline speed levers, each a switch in ``DIFFQ_SPEEDUPS`` / ``worker run --speedups``.

The defaults are what docs/benchmarks.md measured on H100/H200: each lever stays on only
if it paid for itself there. Every lever keeps the output within fp16 tolerance of the
plain pipeline; ``vae-fp16`` additionally falls back to an fp32 decode for any batch whose
fp16 decode is not finite (the stock SDXL VAE overflows in fp16; fixed VAEs do not).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from common.presets import SPEEDUP_LEVERS, speedup_names

log = logging.getLogger("diffq.worker")

LEVERS = SPEEDUP_LEVERS
#: chosen by the measurements in docs/benchmarks.md (CUDA only; the CPU runs the plain pipeline)
CUDA_DEFAULT = ("vae-fp16",)


@dataclass(frozen=True)
class Speedups:
    levers: frozenset[str]

    @classmethod
    def parse(cls, text: str, device: torch.device) -> Speedups:
        names = speedup_names(text)
        if names is None:
            return cls(frozenset(CUDA_DEFAULT if device.type == "cuda" else ()))
        return cls(names)

    def __contains__(self, name: str) -> bool:
        return name in self.levers

    def describe(self) -> str:
        return ",".join(sorted(self.levers)) or "none"


def apply(pipe: Any, speedups: Speedups) -> float:
    """Apply the levers to a freshly loaded pipeline; returns seconds spent (compile is lazy)."""
    started = time.perf_counter()
    if "fuse-qkv" in speedups:
        pipe.unet.fuse_qkv_projections()
    if "channels-last" in speedups:
        pipe.unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if "compile-blocks" in speedups:
        pipe.unet.compile_repeated_blocks(fullgraph=True)
    if "compile-resnets" in speedups:
        import torch._dynamo as dynamo
        from diffusers.models.resnet import ResnetBlock2D

        blocks = [m for m in pipe.unet.modules() if isinstance(m, ResnetBlock2D)]
        # the blocks share one code object; each instance and shape is one more cache entry
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 4 * len(blocks))
        dynamo.config.accumulated_cache_size_limit = max(dynamo.config.accumulated_cache_size_limit, 16 * len(blocks))
        for module in blocks:
            module.compile()
    if "vae-fp16" in speedups:
        pipe.vae.config.force_upcast = False
    log.info("speedups: %s", speedups.describe())
    return time.perf_counter() - started
