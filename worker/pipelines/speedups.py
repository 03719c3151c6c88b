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

``fp8`` (``--precision fp8``; opt-in, Ada/Hopper GPUs) runs the denoiser's wide linear layers
in FP8 with static scales calibrated once per model (:mod:`worker.pipelines.fp8`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from common.errors import ModelLoadError
from common.jobspec import GenParams
from common.presets import CUDA_DEFAULT_SPEEDUPS, DIT_CUDA_DEFAULT_SPEEDUPS, SPEEDUP_LEVERS, speedup_names
from worker.pipelines import empty_negative, fp8, modulation, reductions, step_graphs

log = logging.getLogger("diffq.worker")

LEVERS = SPEEDUP_LEVERS
COMPILE_LEVERS = frozenset({"compile-blocks", "compile-resnets", "compile-unet", "compile-vae"})
#: the denoising steps of a warm-up batch (enough for every graph the real steps use)
WARM_UP_STEPS = 2


@dataclass(frozen=True)
class Speedups:
    levers: frozenset[str]
    #: what ``auto`` means for a DiT pipeline (FLUX), whose levers are not SDXL's; None: no ``auto``
    dit: frozenset[str] | None = None

    @classmethod
    def parse(cls, text: str, device: torch.device, precision: str = "fp16") -> Speedups:
        """The levers ``--speedups`` names (``auto``: the device's defaults for the model's kind,
        and any named beside it), with ``fp8`` for ``--precision fp8`` where this device has FP8
        matmuls."""
        names = speedup_names(text)
        cuda = device.type == "cuda"
        dit = None
        if "auto" in names:
            named = names - {"auto"}
            names = named | frozenset(CUDA_DEFAULT_SPEEDUPS if cuda else ())
            dit = named | frozenset(DIT_CUDA_DEFAULT_SPEEDUPS if cuda else ())
        if precision == "fp8":
            names, dit = names | {"fp8"}, None if dit is None else dit | {"fp8"}
        if "fp8" in names and not fp8_supported(device):
            names, dit = names - {"fp8"}, None if dit is None else dit - {"fp8"}
        return cls(names, dit)

    def for_pipeline(self, pipe: Any) -> Speedups:
        """These levers for ``pipe``: under ``auto``, a DiT's (a transformer, no UNet) own
        defaults in place of SDXL's (a FLUX worker otherwise ran its blocks eagerly: 5.07 against
        3.90 s an image on an H200)."""
        if self.dit is None or getattr(pipe, "unet", None) is not None or getattr(pipe, "transformer", None) is None:
            return self
        return Speedups(self.dit)

    def __contains__(self, name: str) -> bool:
        return name in self.levers

    @property
    def compiles(self) -> bool:
        return bool(self.levers & COMPILE_LEVERS)

    def describe(self) -> str:
        return ",".join(sorted(self.levers)) or "none"

    def per_kind(self) -> str:
        """What a worker says at start, before it knows its model: under ``auto``, each kind's."""
        if self.dit is None or self.dit == self.levers:
            return self.describe()
        return f"{self.describe()} for SDXL, {Speedups(self.dit).describe()} for FLUX"


def fp8_supported(device: torch.device) -> bool:
    """Whether FP8 matmuls run here; where not, one line says so and the worker runs fp16. The
    CPU has torch's reference FP8 kernels (correct, not fast: for tests)."""
    if device.type == "cpu":
        log.info("precision fp8 on the CPU: torch's reference FP8 kernels (correct, not faster)")
        return True
    if device.type != "cuda":
        log.warning("precision fp8 needs an NVIDIA GPU of sm_89 (Ada) or newer; %s runs fp16", device)
        return False
    capability = torch.cuda.get_device_capability(device)
    if capability < fp8.FP8_CAPABILITY:
        log.warning(
            "precision fp8 needs sm_89 (Ada) or sm_90 (Hopper) tensor cores; this %s is sm_%d%d, so this worker "
            "runs fp16 (drop --precision fp8 / DIFFQ_PRECISION to silence this)",
            torch.cuda.get_device_name(device),
            *capability,
        )
        return False
    return True


def apply(
    pipe: Any,
    speedups: Speedups,
    compile_whole: Callable[[torch.nn.Module], None] | None = None,
    *,
    model: str = "",
    fp8_scales: fp8.ScaleStore | None = None,
) -> float:
    """Apply the levers to a freshly loaded pipeline; returns seconds spent (compile is lazy).

    ``compile_whole`` compiles one module as a single static graph (the UNet for
    ``compile-unet``, the VAE decoder for ``compile-vae``); by default ``torch.compile``, the
    worker's cache gives it files that outlive the process (:mod:`worker.pipelines.precompiled`).
    The levers are written for SDXL's UNet. A DiT pipeline (FLUX) takes ``compile-blocks`` (its
    transformer's repeated blocks), ``compile-vae`` and its own (:func:`_apply_to_transformer`)."""
    started = time.perf_counter()
    compile_whole = compile_whole or _compile_lazily
    unet = getattr(pipe, "unet", None)
    if unet is None:
        return _apply_to_transformer(pipe, speedups, model=model, fp8_scales=fp8_scales, compile_whole=compile_whole)
    if "fuse-qkv" in speedups:
        unet.fuse_qkv_projections()
    if "channels-last" in speedups:
        unet.to(memory_format=torch.channels_last)
        pipe.vae.to(memory_format=torch.channels_last)
    if "empty-negative" in speedups:
        # after fuse-qkv (which sets processors), before the compile: a job of 16 skips 70
        # cross-attentions of its 16 unconditional rows
        empty_negative.install(unet)
    if "fp8" in speedups:
        try:
            fp8.apply(pipe, model, fp8_scales, granularity=fp8.GRANULARITY)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # a model FP8 cannot take: the worker's problem, not the job's
            raise ModelLoadError(
                f"precision fp8 could not quantize {model or 'this model'}: {type(exc).__name__}: {exc}"
            ) from exc
    if "persistent-norms" in speedups:
        # before the (lazy) compiles: one read of each LayerNorm row of 1280; on an H100 one UNet
        # call 176.27 -> 172.03 ms under fp8, 246.37 -> 242.57 under fp16 (docs/benchmarks.md)
        reductions.widen()
    else:  # a process-wide switch: what this pipeline compiles is what its levers say
        reductions.restore()
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
    if "cuda-graphs" in speedups:
        # last: the graphs record whatever the UNet's forward is now (a precompiled file's graph)
        step_graphs.install(unet)
    if "encoder-graphs" in speedups:
        # the prompt's encode is the host launching 44 layers' kernels: 37.3 -> 9.2 ms for one
        # prompt on an H200 (bench/encode_graphs.py), which every rank of a group pays whole
        step_graphs.install_encoders(pipe)
    if "cudnn-benchmark" in speedups:
        # cuDNN picks conv algorithms by heuristic unless told to time them; the timing happens
        # once per conv shape, so the warm-up batches pay it, and a new batch size pays it once
        torch.backends.cudnn.benchmark = True
    log.info("speedups: %s", speedups.describe())
    return time.perf_counter() - started


def _compile_lazily(module: torch.nn.Module) -> None:
    module.compile(fullgraph=True, dynamic=False)


def _apply_to_transformer(
    pipe: Any,
    speedups: Speedups,
    *,
    model: str,
    fp8_scales: fp8.ScaleStore | None,
    compile_whole: Callable[[torch.nn.Module], None],
) -> float:
    """``compile-blocks`` for a DiT: regional compile of the transformer's repeated blocks (FLUX:
    19 double-stream and 38 single-stream blocks, two graphs). Not ``fullgraph``: under an xDiT
    group the blocks' attention runs xDiT's own code, which this lever does not vouch for (a
    2-H100 run with ``TORCH_LOGS=graph_breaks`` logged no break there); tracing is lazy, so it
    sees whichever attention the group installs after this. ``compile-vae`` compiles the decoder
    as for SDXL (FLUX's is SDXL's architecture with 16 latent channels)."""
    started = time.perf_counter()
    transformer = getattr(pipe, "transformer", None)
    dit = {
        "vae-fp16",
        "compile-blocks",
        "compile-vae",
        "fp8",
        "cuda-graphs",
        "modulation-once",
        "fuse-qkv",
        "encoder-graphs",
    }
    used = dit if transformer is not None else {"vae-fp16"}
    if speedups.levers - used:
        log.info(
            "speedups: %s apply to SDXL's UNet; this pipeline runs without them",
            ",".join(sorted(speedups.levers - used)),
        )
    if transformer is not None and "fuse-qkv" in speedups:
        # first: FP8 quantizes the fused products, and the compile traces them
        transformer.fuse_qkv_projections()
    if transformer is not None and "fp8" in speedups:
        fp8.apply(pipe, model, fp8_scales, granularity=fp8.GRANULARITY)
    if transformer is not None and "modulation-once" in speedups and modulation.install(pipe) is not None:
        # after fp8 (which leaves these one-row layers alone), before the lazy compile traces them
        log.info("speedups: modulation-once (an image's modulation vectors for all its steps at its first step)")
    if transformer is not None and "compile-blocks" in speedups:
        transformer.compile_repeated_blocks(fullgraph=False)
        log.info("speedups: compile-blocks (the transformer's repeated blocks)")
    if transformer is not None and "compile-vae" in speedups:
        # eager, ATen's GroupNorm reduces each image's group in one thread block (32 for one
        # image); compiled, FLUX's decoder at 1024² took 35.6 ms against 87.3 ms and half the
        # peak memory (one H200, bf16, bench/decode_memory.py --compiled)
        compile_whole(pipe.vae.decoder)
        log.info("speedups: compile-vae (the VAE decoder, one graph)")
    if transformer is not None and "cuda-graphs" in speedups:
        # one GPU measured no gain (3.941 against 3.950 s per FLUX image, 2 H100s, 2026-11-26)
        log.info("speedups: cuda-graphs replays a transformer's calls only in a group split with Ulysses or ring")
    if transformer is not None and "encoder-graphs" in speedups and step_graphs.install_encoders(pipe):
        log.info("speedups: encoder-graphs (the text encoders' calls replayed as CUDA graphs)")
    return time.perf_counter() - started


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far (first compiles and recompiles)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def warm_up(pipe: Any, params: GenParams, batch: int, run: Any, negative: str = "") -> float:
    """Compile before the first job of a shape: one short batch of ``batch`` images, the size
    every later batch of this shape runs at (smaller ones are padded up to it), with the job's
    kind of negative prompt (an empty one runs other graphs under ``empty-negative``). Returns
    the seconds spent; kernels come from the on-disk cache when the host has them."""
    started = time.perf_counter()
    short = GenParams(
        model=params.model, width=params.width, height=params.height, steps=WARM_UP_STEPS, guidance=params.guidance
    )
    before = graphs_compiled()
    run(pipe, short, prompts=["warm-up"] * batch, negatives=[negative] * batch, seeds=list(range(batch)))
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
