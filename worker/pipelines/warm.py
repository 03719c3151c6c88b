"""The worker's warm pipelines: loaded once per (model, dtype, device), adapters read once per
name and switched by merging them into the weights rather than reloaded
(:mod:`worker.pipelines.adapters`).

These pipelines are the one piece of global mutable state in the worker, on purpose: loading SDXL
takes tens of seconds, a job takes a few, so every job after the first must find it warm.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers.utils import logging as diffusers_logging
from transformers.utils import logging as transformers_logging

from common import checkpoints
from common.errors import AdapterNotFound, ConfigError, ModelLoadError
from common.families import refusal, runs_here
from common.jobspec import GenParams
from common.presets import ADAPTER_PRESETS
from common.settings import Settings, point_compile_cache_at
from worker.pipelines import (
    adapter_weights,
    empty_negative,
    families,
    fp8,
    fused_qkv,
    models,
    pinned_device,
    preview,
    step_graphs,
)
from worker.pipelines.adapter_weights import AdapterWeights
from worker.pipelines.adapters import MergedAdapters
from worker.pipelines.backend import Batch
from worker.pipelines.compile_cache import share_compile_cache
from worker.pipelines.generate import is_oom, run_batch, run_split
from worker.pipelines.loading import download_progress, first_line, from_single_file, load_failure
from worker.pipelines.memory import Budget, GiB, Profiles, largest_batch, measure_peak, profile_key
from worker.pipelines.offload import NOT_WITH_OFFLOAD, place, weights_bytes, weights_in_place
from worker.pipelines.pixels import BatchResult, NonFinitePixels
from worker.pipelines.precompiled import Store, install
from worker.pipelines.speedups import COMPILE_LEVERS, Speedups, graphs_compiled, warm_up
from worker.pipelines.speedups import apply as apply_speedups

log = logging.getLogger("diffq.worker")

# Library progress bars and advice are noise in a worker's log: our own lines say what happens.
transformers_logging.set_verbosity_error()
transformers_logging.disable_progress_bar()
diffusers_logging.set_verbosity_error()
diffusers_logging.disable_progress_bar()

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for but torch sees no CUDA GPU on this worker")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


@dataclass
class LoadedPipeline:
    pipe: Any
    model: str
    load_seconds: float
    adapters: dict[str, str] = field(default_factory=dict)  # adapter spec -> adapter name in peft
    merged: MergedAdapters | None = None
    #: where its weights live between uses (worker/pipelines/offload.py)
    offload: str = "none"
    #: the speed levers it runs with (an offload leaves the compile levers out)
    speedups: Speedups = field(default_factory=lambda: Speedups(frozenset()))
    #: (width, height, CFG, most images wanted) -> the batch that fits in memory
    batches: dict[tuple[int, int, bool, int], int] = field(default_factory=dict)
    #: (width, height, CFG) -> the batch sizes compiled for it (graphs are static)
    warm: dict[tuple[int, int, bool], set[int]] = field(default_factory=dict)
    #: batches whose FP8 pixels came out non-finite and ran again without FP8
    fp8_fallbacks: int = 0


class WarmPipelines:
    """Warm pipelines for one device. Keeps ``max_models`` models (default 1: an SDXL UNet
    in fp16 is 5 GB, and a GPU serving one queue rarely needs two)."""

    def __init__(
        self,
        cache_dir: str,
        device: str = "auto",
        dtype: str = "auto",
        speedups: str = "auto",
        max_models: int = 1,
        *,
        precision: str = "fp16",
        compile_cache: str | None = None,
        offload: str = "none",
        gpu_memory: float = 0.0,
        precompile: bool = True,
    ) -> None:
        # compiled kernels persist beside the models, so a restarted worker skips most compile
        # time; with a shared compile cache (a Redis URL) a new host finds them there too
        compiled = point_compile_cache_at(cache_dir)
        share_compile_cache(compile_cache)
        #: the UNet's and decoder's compiled graphs as files (None: torch.compile's lazy way)
        self.precompiled = Store(compiled / "precompiled", compile_cache) if precompile else None
        self.cache_dir = cache_dir
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.speedups = Speedups.parse(speedups, self.device, precision)
        self.max_models = max_models
        if offload == "sequential" and self.device.type != "cuda":
            raise ConfigError("--offload sequential streams weights to a GPU; this worker runs on the CPU")
        # on the CPU there is nothing to offload to; an explicit ``model`` still installs the hooks
        self.offload = "none" if offload == "auto" and self.device.type != "cuda" else offload
        #: this worker's share of its GPU; None on the CPU, where batches are not sized by memory
        self.budget = Budget.of(self.device, gpu_memory) if self.device.type == "cuda" else None
        self.profiles = Profiles(Path(cache_dir) / "memory-profiles.json", compile_cache)
        self.previews = preview.PreviewDecoders(self.device, self.dtype, cache_dir)
        self._loaded: dict[tuple[str, torch.dtype, str], LoadedPipeline] = {}
        self.loads = 0

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> WarmPipelines:
        """The worker's pipelines as its settings say; ``overrides`` replace single arguments
        (an xDiT group takes its own speed levers and never offloads)."""
        options: dict[str, Any] = {
            "cache_dir": settings.cache_dir,
            "device": settings.device,
            "dtype": settings.dtype,
            "speedups": settings.speedups,
            "precision": settings.precision,
            "compile_cache": settings.compile_cache_url(),
            "offload": settings.offload,
            "gpu_memory": settings.gpu_memory,
            "precompile": settings.precompile,
        }
        return cls(**(options | overrides))

    def held_models(self) -> set[str]:
        """The models warm now: the worker prefers queued jobs of these (worker/serving/affinity.py)."""
        return {model for model, _, _ in self._loaded}

    def get(self, model: str, on_progress: Callable[[str | None], None] | None = None) -> tuple[LoadedPipeline, float]:
        """The warm pipeline for ``model`` and the seconds this call spent loading it (0 when warm).
        ``on_progress`` hears what the load is doing ("downloading model: … (37%)"), then None."""
        key = (model, self.dtype, str(self.device))
        if key in self._loaded:
            return self._loaded[key], 0.0
        while len(self._loaded) >= self.max_models:
            self._evict()
        started = time.perf_counter()
        log.info("loading model %s (%s on %s)", model, str(self.dtype).removeprefix("torch."), self.device)

        def report(text: str | None, *, quiet: bool = False) -> None:
            if text and not quiet:
                log.info("%s (%s)", text, model)
            if on_progress is not None:
                on_progress(text)

        report(f"loading model {model}", quiet=True)  # for the job's progress; the log said it above
        try:
            with download_progress(report):
                pipe = self._load(model)
        except Exception as exc:
            if is_oom(exc):
                raise self._no_room(model, exc) from None
            raise
        finally:
            report(None)
        pipe.set_progress_bar_config(disable=True)
        # a worker never trains; and compiled graphs guard on requires_grad, which loading an
        # adapter would otherwise flip to False on the layers it wraps (one recompile per worker)
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                component.requires_grad_(False)
        # the levers that work in any placement first (the memory probes run with them), then
        # where the weights live, then compile and fp8 where the weights stay on the GPU
        family = self.speedups.for_pipeline(pipe)  # what auto means for this model's family, and what applies
        apply_speedups(pipe, Speedups(family.levers - NOT_WITH_OFFLOAD))
        try:
            offload = self._choose_offload(pipe, model, on_progress, family)
            place(pipe, offload, self.device)
        except Exception as exc:
            if not is_oom(exc):
                raise
            del pipe
            raise self._no_room(model, exc) from None
        speedups = family
        if offload != "none":
            left_out = speedups.levers & NOT_WITH_OFFLOAD
            speedups = Speedups(speedups.levers - NOT_WITH_OFFLOAD)
            if left_out:
                log.info(
                    "offload %s: running without %s (a fullgraph compile cannot trace accelerate's offload hooks; "
                    "docs/benchmarks.md)",
                    offload,
                    ",".join(sorted(left_out)),
                )
        elif speedups.levers & NOT_WITH_OFFLOAD:
            apply_speedups(
                pipe,
                Speedups(speedups.levers & NOT_WITH_OFFLOAD),
                self._compiler(model, speedups),
                model=model,
                fp8_scales=fp8.ScaleStore(Path(self.cache_dir)),
            )
        pinned_device.pin(pipe)  # placed for good: look its device up once, not twice a batch
        seconds = time.perf_counter() - started
        self.loads += 1
        log.info("model %s ready in %.1fs (offload %s)", model, seconds, offload)
        loaded = LoadedPipeline(pipe=pipe, model=model, load_seconds=seconds, offload=offload, speedups=speedups)
        self._loaded[key] = loaded
        return loaded, seconds

    def _compiler(self, model: str, speedups: Speedups) -> Callable[[torch.nn.Module], None] | None:
        """How ``compile-unet`` and ``compile-vae`` compile: into files that outlive the process."""
        store = self.precompiled
        if store is None:
            return None
        # cuda-graphs replays what was compiled and changes nothing in it: a worker with it and
        # one without share files
        graphed = Speedups(speedups.levers - {"cuda-graphs"})
        identity = {"model": model, "dtype": str(self.dtype), "speedups": graphed.describe()}
        return lambda module: install(module, store, identity)

    def _no_room(self, model: str, exc: BaseException) -> ModelLoadError:
        """A model that does not fit this worker's GPU is the worker's problem, not the job's: a
        :class:`ModelLoadError` gives the job back for a worker with more memory. The failed
        load's tensors are freed first (its traceback held them, and every later load ran out)."""
        exc.__traceback__ = None
        gc.collect()
        torch.cuda.empty_cache()
        room = self.budget.describe() if self.budget is not None else str(self.device)
        return ModelLoadError(
            f"model {model!r} does not fit in this worker's GPU memory ({room}, offload {self.offload}): "
            "give it --offload model (or sequential), more of the GPU (--gpu-memory), or a larger GPU"
        )

    def _evict(self) -> None:
        key = next(iter(self._loaded))
        log.info("unloading model %s to make room", key[0])
        del self._loaded[key]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _load(self, model: str) -> Any:
        """``model``'s pipeline: a preset its family builds (on the device) or writes (a folder),
        else ``from_pretrained`` on a folder or hub id (``from_single_file`` on a single-file
        checkpoint); one of a family's, or any other
        text-to-image pipeline (``common/families.py``), which the generic family runs."""
        from diffusers import DiffusionPipeline

        build = families.preset(model)
        built = build(self.device, self.dtype, self.cache_dir) if build is not None else None
        if built is not None and not isinstance(built, Path):
            return built
        source: str | Path = built if built is not None else model
        kwargs: dict[str, Any] = {"dtype": self.dtype}
        try:
            if (file := checkpoints.single_file(str(source))) is not None:
                pipe = from_single_file(file, **kwargs)
            elif self.dtype == torch.float16 and not Path(source).exists():
                try:
                    pipe = DiffusionPipeline.from_pretrained(source, variant="fp16", **kwargs)
                except (OSError, ValueError):
                    pipe = DiffusionPipeline.from_pretrained(source, **kwargs)
            else:
                pipe = DiffusionPipeline.from_pretrained(source, **kwargs)
        except ModelLoadError:
            raise
        except Exception as exc:  # diffusers raises OSError, ValueError, HF hub errors...
            raise ModelLoadError(f"model {model!r} cannot be loaded: {load_failure(exc)}") from exc
        if not any(runs_here(cls.__name__) for cls in type(pipe).__mro__):
            raise ModelLoadError(f"model {model!r} {refusal(type(pipe).__name__)}")
        family = families.family_of(pipe)
        if family is families.FAMILIES[-1]:
            log.info(
                "model %s is a %s: run eagerly by the generic family (no speed levers)", model, type(pipe).__name__
            )
        return pipe  # on the CPU: place() puts it where the offload mode says

    def _choose_offload(
        self,
        pipe: Any,
        model: str,
        on_progress: Callable[[str | None], None] | None,
        speedups: Speedups | None = None,
    ) -> str:
        """``auto``: ``none`` where the pipeline and a batch of two at the model's own size fit in
        this worker's share of the GPU, else ``model`` where one image fits with it, else
        ``sequential``. Measured (one denoising step) the first time a GPU model meets a model,
        then read from the memory profiles."""
        if self.budget is None:  # the CPU: nothing to offload to (an explicit model offload still hooks)
            return "none" if self.offload == "auto" else self.offload
        if self.offload != "auto":
            return self.offload
        budget = self.budget
        speedups = speedups or self.speedups.for_pipeline(pipe)
        side = int(getattr(pipe, "default_sample_size", 128)) * int(getattr(pipe, "vae_scale_factor", 8))
        params = GenParams(model=model, width=side, height=side, steps=1, guidance=5.0)
        if on_progress is not None:
            on_progress(f"measuring GPU memory for {model} (once per GPU model)")
        try:
            weights = weights_bytes(pipe)
            resident = self._peak(pipe, params, 2, "none", speedups) if budget.fits(weights) else None
            if resident is not None and budget.fits(resident):
                why = f"the pipeline and a batch of 2 at {side}² peak at {resident / GiB:.1f} GiB"
                chosen = "none"
            else:
                light = Speedups(speedups.levers - NOT_WITH_OFFLOAD)
                one = self._peak(pipe, params, 1, "model", light)
                chosen = "model" if one is not None and budget.fits(one) else "sequential"
                needs = f"{weights / GiB:.1f} GiB of weights" if resident is None else f"{resident / GiB:.1f} GiB"
                why = f"resident with a batch of 2 at {side}² needs {needs}" + (
                    f"; with model offload one image peaks at {one / GiB:.1f} GiB" if one is not None else ""
                )
        finally:
            if on_progress is not None:
                on_progress(None)
        log.info("offload auto: %s, for %s (%s)", chosen, budget.describe(), why)
        return chosen

    def _peak(self, pipe: Any, params: GenParams, batch: int, offload: str, speedups: Speedups) -> int | None:
        """Peak bytes of one step of ``batch`` images with ``pipe`` placed by ``offload``: from the
        memory profiles, else measured now (and kept)."""
        assert self.budget is not None
        key = self._profile_key(params, offload, speedups)
        known = self.profiles.peaks(key)
        if batch in known:
            return known[batch]
        place(pipe, offload, self.device)
        peak = measure_peak(self.device, _probe(pipe, params))(batch)
        if peak is not None:
            self.profiles.record(key, batch, peak)
        return peak

    def _profile_key(self, params: GenParams, offload: str, speedups: Speedups) -> str:
        assert self.budget is not None
        dtype = str(self.dtype).removeprefix("torch.")
        return profile_key(
            self.budget.gpu, params.model, params.width, params.height, params.guidance > 1.0, dtype,
            speedups.describe(), offload,
        )  # fmt: skip

    def batch_for(
        self, loaded: LoadedPipeline, params: GenParams, wanted: int, on_progress: Callable[[str | None], None] | None
    ) -> int:
        """The largest batch of at most ``wanted`` images that fits this worker's GPU memory at
        ``params``' size (:mod:`worker.pipelines.memory`); ``wanted`` on the CPU."""
        if self.budget is None or wanted <= 1:
            return max(1, wanted)
        shape = (params.width, params.height, params.guidance > 1.0, wanted)
        if shape in loaded.batches:
            return loaded.batches[shape]
        key = self._profile_key(params, loaded.offload, loaded.speedups)
        known = self.profiles.peaks(key)
        probing = on_progress is not None and any(size not in known for size in (1, 2))
        if probing:
            on_progress(f"measuring GPU memory for {params.width}x{params.height} (once per GPU model and size)")
        try:
            batch, peak = largest_batch(
                measure_peak(self.device, _probe(loaded.pipe, params)), known, wanted, self.budget,
                remember=lambda size, bytes_: self.profiles.record(key, size, bytes_),
            )  # fmt: skip
        finally:
            if probing:
                on_progress(None)
        peak_text = f"{peak / GiB:.1f} GiB" if peak is not None else "unmeasured"
        log.info(
            "batch %d for %dx%d (peak %s of %s; offload %s)",
            batch, params.width, params.height, peak_text, self.budget.describe(), loaded.offload,
        )  # fmt: skip
        loaded.batches[shape] = batch
        return batch

    def generate(
        self,
        loaded: LoadedPipeline,
        batch: Batch,
        on_step: Callable[[int, int], None] | None = None,
        on_progress: Callable[[str | None], None] | None = None,
    ) -> tuple[BatchResult, int]:
        """A job's images from this process's pipeline. An xDiT group's rank 0 implements the same
        :class:`~worker.pipelines.backend.GenerationBackend` call over every rank (:mod:`worker.group`)."""
        params, prompts, negatives, seeds, max_batch = (
            batch.params, batch.prompts, batch.negatives, batch.seeds, batch.max_batch
        )  # fmt: skip
        before = graphs_compiled()
        pad_to = None
        speedups = loaded.speedups  # what the batch ran with (an FP8 batch run again without FP8 did not)
        max_batch = self.batch_for(loaded, params, max_batch, on_progress)
        if self.budget is not None:
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            if loaded.speedups.compiles:
                cfg = params.guidance > 1.0
                # under empty-negative a batch with a negative prompt runs other graphs than one without
                empty = empty_negative.kwargs(loaded.pipe, negatives, cfg, 1) is not None
                sizes = loaded.warm.setdefault((params.width, params.height, cfg, empty), set())
                wanted = min(max_batch, len(prompts))
                if not any(size >= wanted for size in sizes):
                    self._warm_up(loaded, params, wanted, on_progress, negative=next((n for n in negatives if n), ""))
                    sizes.add(wanted)
                pad_to = padding(sizes)
            result, fitted = run_split(
                loaded.pipe, params, prompts, negatives, seeds, max_batch, on_step=on_step, pad_to=pad_to
            )
        except torch._dynamo.exc.TorchDynamoException as exc:
            if not loaded.speedups.compiles:
                raise
            self._run_eager(loaded, exc)  # the worker's environment, not the job: go on without compiling
            if on_progress is not None:
                on_progress(None)
            result, fitted = run_split(loaded.pipe, params, prompts, negatives, seeds, max_batch, on_step=on_step)
        except NonFinitePixels:
            if "fp8" not in loaded.speedups:
                raise
            result, fitted = self._without_fp8(loaded, batch, max_batch, on_step)
            speedups = Speedups(loaded.speedups.levers - {"fp8"})
        result.compiles = graphs_compiled() - before
        result.batch, result.offload = min(fitted, len(prompts)), loaded.offload
        # the weights' own dtype: a preset may load in another (flux-random is bf16 on a GPU)
        result.precision = precision_of(speedups, getattr(loaded.pipe, "dtype", None) or self.dtype)
        if self.budget is not None:
            result.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        return result, fitted

    def _without_fp8(
        self,
        loaded: LoadedPipeline,
        batch: Batch,
        max_batch: int,
        on_step: Callable[[int, int], None] | None,
    ) -> tuple[BatchResult, int]:
        """The batch again with every FP8 layer computing in the model's dtype (eagerly: the
        compiled and captured graphs are FP8's), after its FP8 pixels came out non-finite."""
        if not loaded.fp8_fallbacks:
            log.warning(
                "fp8: a batch of %s came out with non-finite pixels (an activation past its calibrated scale); it "
                "ran again without FP8 and nothing non-finite was written. Said once: job results count them "
                "(precision %s)",
                loaded.model,
                precision_of(Speedups(frozenset()), getattr(loaded.pipe, "dtype", None) or self.dtype),
            )
        loaded.fp8_fallbacks += 1
        with fp8.bypassed(loaded.pipe), step_graphs.paused(loaded.pipe), torch.compiler.set_stance("force_eager"):
            return run_split(
                loaded.pipe, batch.params, batch.prompts, batch.negatives, batch.seeds, max_batch, on_step=on_step
            )

    def _warm_up(
        self,
        loaded: LoadedPipeline,
        params: GenParams,
        batch: int,
        on_progress: Callable[[str | None], None] | None,
        negative: str = "",
    ) -> None:
        size = f"{params.width}x{params.height}"
        if on_progress is not None:
            on_progress(f"compiling for {size} (once per size and worker; cached on disk)")
        warm_up(loaded.pipe, params, batch, run=run_batch, negative=negative)
        if on_progress is not None:
            on_progress(None)

    def _run_eager(self, loaded: LoadedPipeline, exc: BaseException) -> None:
        """torch.compile cannot work here (most often: no C compiler or Python headers for
        Triton's launcher). Every compiled region runs eagerly from now on, for this worker."""
        levers = self.speedups.levers - COMPILE_LEVERS
        why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        log.error(
            "torch.compile failed on this worker (%s); running without %s from now on. Give the worker a C "
            "compiler and Python headers (gcc, python3-dev), or set --speedups %s",
            why,
            ",".join(sorted(self.speedups.levers & COMPILE_LEVERS)),
            ",".join(sorted(levers)) or "none",
        )
        torch.compiler.set_stance("force_eager")
        self.speedups = Speedups(levers)
        loaded.speedups = Speedups(loaded.speedups.levers - COMPILE_LEVERS)

    def use_adapter(self, loaded: LoadedPipeline, adapter: str | None, scale: float) -> None:
        """Make ``adapter`` (or none) the one merged into the weights at ``scale``."""
        self.use_adapters(loaded, ((adapter, scale),) if adapter is not None else ())

    def use_adapters(self, loaded: LoadedPipeline, stack: tuple[tuple[str, float], ...]) -> None:
        """Make these adapters, at their weights and in this order (or none), the ones merged
        into the weights; each is loaded the first time it is named (see
        :mod:`worker.pipelines.adapters` for why merged)."""
        if not stack and loaded.merged is None:
            return
        names = [loaded.adapters.get(adapter) for adapter, _ in stack]
        if loaded.merged is not None and all(names):
            wanted = tuple((name, weight) for name, (_, weight) in zip(names, stack, strict=True))
            if loaded.merged.current_stack(wanted):
                return  # nothing to change: no offload hooks to take off and put back
        with weights_in_place(loaded.pipe, loaded.offload, self.device):
            if loaded.merged is None:
                loaded.merged = MergedAdapters(loaded.pipe)
            for i, (adapter, _) in enumerate(stack):
                if names[i] is None:
                    loaded.merged.restore()  # a new adapter wraps pristine weights
                    names[i] = self._load_adapter(loaded, loaded.merged, adapter)
            loaded.merged.use_stack(tuple((name, weight) for name, (_, weight) in zip(names, stack, strict=True)))
            touched = loaded.merged.touched()
            if "fuse-qkv" in loaded.speedups:
                touched += fused_qkv.refresh(loaded.pipe, touched)  # the fused layers read no part adapters merge into
            if "fp8" in loaded.speedups:
                fp8.refresh(loaded.pipe, touched)  # the FP8 copies of the weights adapters change
            step_graphs.reset(loaded.pipe, touched)  # a switch may give weights new memory; graphs replay the old

    def use_decoder(self, loaded: LoadedPipeline, name: str | None) -> None:
        """The job's preview decoder (``--decoder``) for the next batch, or the model's VAE;
        compiled where the model's levers compile its VAE (``compile-vae``)."""
        preview.use(loaded.pipe, self.previews, name, compiled="compile-vae" in loaded.speedups)

    def _load_adapter(self, loaded: LoadedPipeline, merged: MergedAdapters, adapter: str) -> str:
        path = models.ensure_tiny_dora(self.cache_dir) if adapter == "tiny-dora" else Path(adapter).expanduser()
        if not path.exists():
            presets = ", ".join(ADAPTER_PRESETS)
            raise AdapterNotFound(
                f"adapter {adapter!r} not found on this worker: give a folder or .safetensors file "
                f"that every worker can read, or a preset ({presets})"
            )
        name = "a" + hashlib.sha1(adapter.encode()).hexdigest()[:12]
        kwargs: dict[str, Any] = {"adapter_name": name}
        source: Path = path
        if path.is_file():
            source, kwargs["weight_name"] = path.parent, path.name
        started = time.perf_counter()
        try:
            direct = adapter_weights.read(loaded.pipe, source, kwargs.get("weight_name"))
            if isinstance(direct, AdapterWeights):
                merged.direct[name] = direct
                how = f"read, {len(direct.layers)} layers merged without PEFT"
            else:
                loaded.pipe.load_lora_weights(str(source), **kwargs)
                merged.peft.add(name)
                how = f"loaded by PEFT: {direct}"
        except Exception as exc:
            raise AdapterNotFound(f"adapter {adapter!r} cannot be loaded: {first_line(exc)}") from exc
        log.info("adapter %s %s, as %s in %.2fs", adapter, how, name, time.perf_counter() - started)
        loaded.adapters[adapter] = name
        return name


def _probe(pipe: Any, params: GenParams) -> Callable[[int], object]:
    """One denoising step and the decode of ``batch`` images at ``params``' size: the shape of a
    job's memory use (the UNet's activations, then the VAE's), in seconds rather than a job's time."""
    short = GenParams(model=params.model, width=params.width, height=params.height, steps=1, guidance=params.guidance)

    def run(batch: int) -> object:
        prompts = ["memory probe"] * batch
        with step_graphs.paused(pipe):  # a graph per probed size would hold memory no job uses
            # a negative prompt: the full cross-attention's memory, which the empty-negative lever only lowers
            negatives = ["memory probe"] * batch
            return run_batch(pipe, short, prompts=prompts, negatives=negatives, seeds=list(range(batch)))

    return run


def padding(sizes: set[int]) -> Callable[[int], int]:
    """The batch size to run ``n`` images at: the smallest one compiled that holds them (a tail
    chunk of 3 runs on the graph for 8), else ``n`` itself (a new graph, compiled once)."""

    def pad_to(n: int) -> int:
        return min((size for size in sizes if size >= n), default=n)

    return pad_to


def precision_of(speedups: Speedups, dtype: torch.dtype) -> str:
    """The word a job's result and ``producer status`` show: fp8, or the weights' dtype."""
    if "fp8" in speedups:
        return "fp8"
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))
