"""Pipeline speed levers, each a switch in ``DIFFQ_SPEEDUPS`` / ``worker run --speedups``.

The defaults are what docs/benchmarks.md measured on H100/H200: each lever is on by default
only if it paid for itself there. Every default lever keeps the output within fp16 tolerance of
the plain pipeline; ``vae-fp16`` additionally falls back to an fp32 decode for any batch whose
fp16 decode is not finite (the stock SDXL VAE overflows in fp16; fixed VAEs do not).

The compile levers compile SDXL's UNet (whole, or its repeated blocks and ResNet blocks) and
the VAE decoder. Every graph is static: compiled for one batch size, which :func:`warm_up` runs
before the first job, and smaller batches (a tail chunk) are padded up to it
(:func:`worker.pipelines.generate.run_split`), so a campaign never compiles mid-way and never
pays for dynamic shapes (a second, symbolic trace of every graph). Kernels persist in the model
cache (``TORCHINDUCTOR_CACHE_DIR``), so a worker restarted on the same host compiles from cache.

``fp8`` (opt-in, Hopper only) quantizes the UNet's wide linear layers to FP8 with torchao and
keeps the fp16 UNet beside it: a batch whose FP8 latents are not finite is denoised again in
fp16, and the job's result says so.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from common.errors import ConfigError, ModelLoadError
from common.jobspec import GenParams
from common.presets import CUDA_DEFAULT_SPEEDUPS, SPEEDUP_LEVERS, speedup_names

log = logging.getLogger("diffq.worker")

LEVERS = SPEEDUP_LEVERS
COMPILE_LEVERS = frozenset({"compile-blocks", "compile-resnets", "compile-unet", "compile-vae"})
#: torchao's FP8 matmuls need Hopper (sm_90) or newer
FP8_CAPABILITY = (9, 0)
#: linear layers narrower than this stay fp16: quantizing activations costs more than FP8 saves
FP8_MIN_FEATURES = 640
#: the least activation amax a dynamic FP8 scale is taken from. Without it an all-zero row gets
#: scale 0 and quantizes to 0/0 = NaN; SDXL encodes an empty negative prompt as all zeros
#: (``force_zeros_for_empty_prompt``), so with per-row scales every CFG batch was NaN
FP8_ACTIVATION_LB = 1e-12
#: the denoising steps of a warm-up batch (enough for every graph the real steps use)
WARM_UP_STEPS = 2


@dataclass(frozen=True)
class Speedups:
    levers: frozenset[str]

    @classmethod
    def parse(cls, text: str, device: torch.device) -> Speedups:
        names = speedup_names(text)
        if names is None:
            return cls(frozenset(CUDA_DEFAULT_SPEEDUPS if device.type == "cuda" else ()))
        if "fp8" in names:
            _check_fp8(device)
        return cls(names)

    def __contains__(self, name: str) -> bool:
        return name in self.levers

    @property
    def compiles(self) -> bool:
        return bool(self.levers & COMPILE_LEVERS)

    def describe(self) -> str:
        return ",".join(sorted(self.levers)) or "none"


def _check_fp8(device: torch.device) -> None:
    """Refuse ``fp8`` at start-up, in one line, anywhere torchao's FP8 matmuls cannot run."""
    if device.type != "cuda":
        raise ConfigError(f"--speedups fp8 needs an NVIDIA Hopper GPU (sm_90 or newer); this worker runs on {device}")
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"--speedups fp8 needs an NVIDIA Hopper GPU (sm_90 or newer); this worker's {name} is "
            f"sm_{capability[0]}{capability[1]}: drop fp8 from --speedups / DIFFQ_SPEEDUPS"
        )
    try:
        import torchao  # noqa: F401
    except ImportError:
        raise ConfigError("--speedups fp8 needs torchao: pip install torchao (or drop fp8)") from None


def apply(pipe: Any, speedups: Speedups, compile_whole: Callable[[torch.nn.Module], None] | None = None) -> float:
    """Apply the levers to a freshly loaded pipeline; returns seconds spent (compile is lazy).

    ``compile_whole`` compiles one module as a single static graph (the UNet for
    ``compile-unet``, the VAE decoder for ``compile-vae``); by default ``torch.compile``, the
    worker's cache gives it files that outlive the process (:mod:`worker.pipelines.precompiled`).
    The levers are written for SDXL's UNet. A DiT pipeline (FLUX) takes ``compile-blocks`` (its
    transformer's repeated blocks) and runs without the others."""
    started = time.perf_counter()
    compile_whole = compile_whole or _compile_lazily
    unet = getattr(pipe, "unet", None)
    if unet is None:
        return _apply_to_transformer(pipe, speedups)
    if "fuse-qkv" in speedups:
        unet.fuse_qkv_projections()
    if "channels-last" in speedups:
        unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if "fp8" in speedups:
        try:
            _quantize_fp8(pipe)
        except Exception as exc:  # torchao asserts on what it does not support; a load error, not a crash
            raise ModelLoadError(f"--speedups fp8 could not quantize this UNet: {type(exc).__name__}: {exc}") from exc
    if "compile-unet" in speedups:
        # one graph: also fuses what lies between the blocks (Transformer2DModel's GroupNorm and
        # permutes, the samplers, the skip concatenations); measured 240 against 254 ms a step
        compile_whole(unet)
        if speedups.levers & {"compile-blocks", "compile-resnets"}:
            log.info("speedups: compile-unet compiles the whole UNet; compile-blocks/compile-resnets are left out")
    elif "compile-blocks" in speedups:
        unet.compile_repeated_blocks(fullgraph=True, dynamic=False)
    if "compile-resnets" in speedups and "compile-unet" not in speedups:
        import torch._dynamo as dynamo
        from diffusers.models.resnet import ResnetBlock2D

        blocks = [m for m in unet.modules() if isinstance(m, ResnetBlock2D)]
        # the blocks share one code object; each instance and shape is one more cache entry
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 4 * len(blocks))
        dynamo.config.accumulated_cache_size_limit = max(dynamo.config.accumulated_cache_size_limit, 16 * len(blocks))
        for module in blocks:
            module.compile(dynamic=False)
    if "compile-vae" in speedups:
        # the decoder is memory-bound (14 % of the matmul ceiling on an H100): fusing its
        # GroupNorm, SiLU and residual adds saves passes over 1024² activations
        compile_whole(pipe.vae.decoder)
    if "vae-fp16" in speedups:
        pipe.vae.config.force_upcast = False
    if "cudnn-benchmark" in speedups:
        # cuDNN picks conv algorithms by heuristic unless told to time them; the timing happens
        # once per conv shape, so the warm-up batches pay it, and a new batch size pays it once
        torch.backends.cudnn.benchmark = True
    log.info("speedups: %s", speedups.describe())
    return time.perf_counter() - started


def _compile_lazily(module: torch.nn.Module) -> None:
    module.compile(fullgraph=True, dynamic=False)


def _apply_to_transformer(pipe: Any, speedups: Speedups) -> float:
    """``compile-blocks`` for a DiT: regional compile of the transformer's repeated blocks (FLUX:
    19 double-stream and 38 single-stream blocks, two graphs). Not ``fullgraph``: under an xDiT
    group the blocks' attention runs xDiT's all-to-all, where Dynamo breaks the graph; tracing is
    lazy, so it sees whichever attention the group installs after this."""
    started = time.perf_counter()
    transformer = getattr(pipe, "transformer", None)
    used = {"vae-fp16", "compile-blocks"} if transformer is not None else {"vae-fp16"}
    if speedups.levers - used:
        log.info(
            "speedups: %s apply to SDXL's UNet; this pipeline runs without them",
            ",".join(sorted(speedups.levers - used)),
        )
    if transformer is not None and "compile-blocks" in speedups:
        transformer.compile_repeated_blocks(fullgraph=False)
        log.info("speedups: compile-blocks (the transformer's repeated blocks)")
    return time.perf_counter() - started


def fp8_linear(module: torch.nn.Module, name: str) -> bool:
    """Which UNet linears FP8 takes: wide ones (narrow ones lose more to quantizing the
    activation than FP8 saves), except cross-attention's key and value projections. Those read
    the text embeddings: 77 tokens per image, a GEMM too short to gain, and for an empty
    negative prompt a block of zeros."""
    if not isinstance(module, torch.nn.Linear):
        return False
    if name.endswith(("attn2.to_k", "attn2.to_v")):
        return False
    return min(module.in_features, module.out_features) >= FP8_MIN_FEATURES


def _quantize_fp8(pipe: Any) -> None:
    """FP8 weights and dynamic FP8 activations for the UNet's wide linears; the fp16 UNet stays
    as ``pipe.diffq_fp16_unet`` for batches FP8 cannot finish (see :func:`run_batch`).

    Scales are per row for a bf16 UNet; torchao 0.18 takes per-row scales from bf16 weights
    only (an assertion), so an fp16 UNet gets one scale per tensor."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    pipe.diffq_fp16_unet = copy.deepcopy(pipe.unet)
    granularity = PerRow() if pipe.unet.dtype == torch.bfloat16 else PerTensor()
    config = Float8DynamicActivationFloat8WeightConfig(granularity=granularity, activation_value_lb=FP8_ACTIVATION_LB)
    quantize_(pipe.unet, config, filter_fn=fp8_linear)
    log.info("fp8: UNet linears of %d+ features quantized (%s scales)", FP8_MIN_FEATURES, type(granularity).__name__)
    if isinstance(granularity, PerTensor):
        log.warning(
            "fp8 on a %s UNet takes one scale per tensor, measured 2.9 %% slower than no fp8 on an H100; "
            "per-row scales need --dtype bfloat16 (docs/benchmarks.md)",
            str(pipe.unet.dtype).removeprefix("torch."),
        )


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far (first compiles and recompiles)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up(pipe: Any, params: GenParams, batch: int, run: Any) -> float:
    """Compile before the first job of a shape: one short batch of ``batch`` images, the size
    every later batch of this shape runs at (smaller ones are padded up to it). Returns the
    seconds spent; kernels come from the on-disk cache when the host has them."""
    started = time.perf_counter()
    short = GenParams(
        model=params.model, width=params.width, height=params.height, steps=WARM_UP_STEPS, guidance=params.guidance
    )
    before = graphs_compiled()
    run(pipe, short, prompts=["warm-up"] * batch, negatives=[""] * batch, seeds=list(range(batch)))
    seconds = time.perf_counter() - started
    log.info(
        "compiled for %dx%d in %.1fs (%d graph(s); batch %d)",
        params.width,
        params.height,
        seconds,
        graphs_compiled() - before,
        batch,
    )
    return seconds
