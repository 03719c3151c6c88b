"""Pipeline speed levers, each a switch in ``DIFFQ_SPEEDUPS`` / ``worker run --speedups``.

The defaults are what docs/benchmarks.md measured on H100/H200: each lever is on by default
only if it paid for itself there. Every default lever keeps the output within fp16 tolerance of
the plain pipeline; ``vae-fp16`` additionally falls back to an fp32 decode for any batch whose
fp16 decode is not finite (the stock SDXL VAE overflows in fp16; fixed VAEs do not).

The compile levers compile SDXL's UNet (whole, or its repeated blocks) and the VAE decoder.
Every graph is static: compiled for one batch size, which :func:`warm_up` runs before the
first job, and smaller batches (a tail chunk) are padded up to it
(:func:`worker.pipelines.generate.run_split`), so a campaign never compiles mid-way and never
pays for dynamic shapes (a second, symbolic trace of every graph). Kernels persist in the model
cache (``TORCHINDUCTOR_CACHE_DIR``), so a worker restarted on the same host compiles from cache.

Two entries of a :class:`Speedups` are not levers a user names: ``fp8`` (``--precision fp8``;
opt-in, Ada/Hopper GPUs) runs the denoiser's wide linear layers in FP8 with static scales
calibrated once per model (:mod:`worker.pipelines.fp8`), and ``modulation-once`` is FLUX's own
(:attr:`Family.own`), applied whatever ``--speedups`` says.
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
from common.presets import CUDA_DEFAULT_SPEEDUPS, speedup_names
from worker.pipelines import empty_negative, fp8, modulation, reductions, samplers, step_graphs
from worker.pipelines.families import FAMILIES, Family, family_of

log = logging.getLogger("diffq.worker")

COMPILE_LEVERS = frozenset({"compile-blocks", "compile-unet", "compile-vae"})
#: the denoising steps of a warm-up batch (enough for every graph the real steps use)
WARM_UP_STEPS = 2


@dataclass(frozen=True)
class Speedups:
    levers: frozenset[str]
    #: under ``auto``: the levers named beside it, to which each model family adds its own
    #: defaults (:meth:`for_pipeline`); None: no ``auto``, the levers are what was named
    beside_auto: frozenset[str] | None = None
    cuda: bool = False

    @classmethod
    def parse(cls, text: str, device: torch.device, precision: str = "fp16") -> Speedups:
        """The levers ``--speedups`` names (``auto``: the device's defaults for the model's family,
        and any named beside it), with ``fp8`` for ``--precision fp8`` where this device has FP8
        matmuls. ``levers`` holds SDXL's meaning of ``auto`` until the model is known."""
        names = speedup_names(text)
        cuda = device.type == "cuda"
        beside = None
        if "auto" in names:
            beside = names - {"auto"}
            names = beside | frozenset(CUDA_DEFAULT_SPEEDUPS if cuda else ())
        if precision == "fp8":
            names, beside = names | {"fp8"}, None if beside is None else beside | {"fp8"}
        if "fp8" in names and not fp8_supported(device):
            names, beside = names - {"fp8"}, None if beside is None else beside - {"fp8"}
        return cls(names, beside, cuda)

    def wanted_for(self, family: Family) -> frozenset[str]:
        """The levers asked for ``family`` (``auto``: its own defaults on CUDA), before its code says which apply."""
        if self.beside_auto is None:
            return self.levers
        return self.beside_auto | frozenset(family.auto if self.cuda else ())

    def for_pipeline(self, pipe: Any) -> Speedups:
        """These levers for ``pipe``'s family: under ``auto`` its own defaults (a FLUX worker
        given SDXL's ran its blocks eagerly: 5.07 against 3.90 s an image on an H200), and only
        the levers its code applies; the others are left out with one line."""
        family = family_of(pipe)
        wanted = self.wanted_for(family)
        kept = (wanted & family.levers) | family.own
        if wanted - kept:
            log.info(
                "speedups: %s do not apply to %s (%s); it runs without them",
                ",".join(sorted(wanted - kept)),
                family.title,
                type(pipe).__name__,
            )
        return Speedups(kept)

    def __contains__(self, name: str) -> bool:
        return name in self.levers

    @property
    def compiles(self) -> bool:
        return bool(self.levers & COMPILE_LEVERS)

    def describe(self) -> str:
        return ",".join(sorted(self.levers)) or "none"

    def per_kind(self) -> str:
        """What a worker says at start, before it knows its model: under ``auto``, each family's."""
        if self.beside_auto is None:
            return self.describe()
        kinds: dict[str, list[str]] = {}
        for family in FAMILIES[:-1]:  # the generic family runs without levers
            kinds.setdefault(Speedups((self.wanted_for(family) & family.levers) | family.own).describe(), []).append(
                family.title
            )
        if len(kinds) == 1:
            return next(iter(kinds))
        return ", ".join(f"{levers} for {' and '.join(titles)}" for levers, titles in kinds.items())


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
    if family_of(pipe).denoiser != "unet" or unet is None:
        return _apply_to_transformer(pipe, speedups, model=model, fp8_scales=fp8_scales, compile_whole=compile_whole)
    if "fuse-qkv" in speedups:
        unet.fuse_qkv_projections()
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
        samplers.one_timestep_dtype(unet)  # one graph for every sampler, not one per timestep dtype
        if "compile-blocks" in speedups:
            log.info("speedups: compile-unet compiles the whole UNet; compile-blocks is left out")
    elif "compile-blocks" in speedups:
        unet.compile_repeated_blocks(fullgraph=True, dynamic=False)
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
        # prompt on an H200 (a one-off script, in git history), which every rank of a group pays whole
        step_graphs.install_encoders(pipe)
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
    if transformer is not None and "fuse-qkv" in speedups:
        # first: FP8 quantizes the fused products, and the compile traces them
        transformer.fuse_qkv_projections()
    if transformer is not None and "fp8" in speedups:
        fp8.apply(pipe, model, fp8_scales, granularity=fp8.GRANULARITY)
    if transformer is not None and "modulation-once" in speedups and modulation.install(pipe) is not None:
        # after fp8 (which leaves these one-row layers alone), before the lazy compile traces them
        log.info("speedups: modulation-once (an image's modulation vectors for all its steps at its first step)")
    if transformer is not None and "compile-blocks" in speedups:
        if not getattr(transformer, "_repeated_blocks", None):  # diffusers names FLUX's blocks, not SD3's or PixArt's
            transformer._repeated_blocks = list(family_of(pipe).blocks)
        transformer.compile_repeated_blocks(fullgraph=False)
        log.info("speedups: compile-blocks (the transformer's repeated blocks)")
    if transformer is not None and "compile-vae" in speedups:
        # eager, ATen's GroupNorm reduces each image's group in one thread block (32 for one
        # image); compiled, FLUX's decoder at 1024² took 35.6 ms against 87.3 ms and half the
        # peak memory (one H200, bf16; the one-off script is in git history)
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
