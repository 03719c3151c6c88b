"""The worker's warm pipelines: loaded once per (model, dtype, device), adapters loaded once
per name and switched with ``set_adapters`` rather than reloaded.

This cache is the one piece of global mutable state in the worker, on purpose: loading SDXL
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

from common.errors import AdapterNotFound, ModelLoadError
from common.jobspec import GenParams
from common.presets import ADAPTER_PRESETS, MODEL_PRESETS
from common.settings import point_compile_cache_at
from worker.pipelines import models
from worker.pipelines.adapters import MergedAdapters
from worker.pipelines.backend import Batch
from worker.pipelines.compile_cache import share_compile_cache
from worker.pipelines.generate import BatchResult, run_batch, run_split
from worker.pipelines.loading import download_progress
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
    #: (width, height, CFG) -> the batch sizes compiled for it (graphs are static)
    warm: dict[tuple[int, int, bool], set[int]] = field(default_factory=dict)


class PipelineCache:
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
        compile_cache: str | None = None,
    ) -> None:
        # compiled kernels persist beside the models, so a restarted worker skips most compile
        # time; with a shared compile cache (a Redis URL) a new host finds them there too
        point_compile_cache_at(cache_dir)
        share_compile_cache(compile_cache)
        self.cache_dir = cache_dir
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.speedups = Speedups.parse(speedups, self.device)
        self.max_models = max_models
        self._loaded: dict[tuple[str, torch.dtype, str], LoadedPipeline] = {}
        self.loads = 0

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
        finally:
            report(None)
        pipe.set_progress_bar_config(disable=True)
        # a worker never trains; and compiled graphs guard on requires_grad, which loading an
        # adapter would otherwise flip to False on the layers it wraps (one recompile per worker)
        for component in pipe.components.values():
            if isinstance(component, torch.nn.Module):
                component.requires_grad_(False)
        apply_speedups(pipe, self.speedups)
        seconds = time.perf_counter() - started
        self.loads += 1
        log.info("model %s ready in %.1fs", model, seconds)
        loaded = LoadedPipeline(pipe=pipe, model=model, load_seconds=seconds)
        self._loaded[key] = loaded
        return loaded, seconds

    def _evict(self) -> None:
        key = next(iter(self._loaded))
        log.info("unloading model %s to make room", key[0])
        del self._loaded[key]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _load(self, model: str) -> Any:
        from diffusers import DiffusionPipeline, FluxPipeline, StableDiffusionXLPipeline

        if model == "sdxl-random":
            return models.sdxl_random(self.device, self.dtype)
        if model == "flux-random":
            return models.flux_random(self.device, torch.bfloat16 if self.device.type == "cuda" else self.dtype)
        source: str | Path = model
        if model == "tiny":
            source = models.ensure_tiny(self.cache_dir)
        kwargs: dict[str, Any] = {"dtype": self.dtype}
        try:
            if self.dtype == torch.float16 and not Path(source).exists():
                try:
                    pipe = DiffusionPipeline.from_pretrained(source, variant="fp16", **kwargs)
                except (OSError, ValueError):
                    pipe = DiffusionPipeline.from_pretrained(source, **kwargs)
            else:
                pipe = DiffusionPipeline.from_pretrained(source, **kwargs)
        except Exception as exc:  # diffusers raises OSError, ValueError, HF hub errors...
            raise ModelLoadError(f"model {model!r} cannot be loaded: {load_failure(exc)}") from exc
        if not isinstance(pipe, StableDiffusionXLPipeline | FluxPipeline):
            raise ModelLoadError(
                f"model {model!r} is a {type(pipe).__name__}; diffq runs SDXL and FLUX pipelines "
                "(StableDiffusionXLPipeline, FluxPipeline)"
            )
        return pipe.to(self.device)

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
        try:
            if self.speedups.compiles:
                sizes = loaded.warm.setdefault((params.width, params.height, params.guidance > 1.0), set())
                wanted = min(max_batch, len(prompts))
                if not any(size >= wanted for size in sizes):
                    self._warm_up(loaded, params, wanted, on_progress)
                    sizes.add(wanted)
                pad_to = padding(sizes)
            result, fitted = run_split(
                loaded.pipe, params, prompts, negatives, seeds, max_batch, on_step=on_step, pad_to=pad_to
            )
        except torch._dynamo.exc.TorchDynamoException as exc:
            if not self.speedups.compiles:
                raise
            self._run_eager(exc)  # the worker's environment, not the job: go on without compiling
            if on_progress is not None:
                on_progress(None)
            result, fitted = run_split(loaded.pipe, params, prompts, negatives, seeds, max_batch, on_step=on_step)
        result.compiles = graphs_compiled() - before
        return result, fitted

    def _warm_up(
        self, loaded: LoadedPipeline, params: GenParams, batch: int, on_progress: Callable[[str | None], None] | None
    ) -> None:
        size = f"{params.width}x{params.height}"
        if on_progress is not None:
            on_progress(f"compiling for {size} (once per size and worker; cached on disk)")
        warm_up(loaded.pipe, params, batch, run=run_batch)
        if on_progress is not None:
            on_progress(None)

    def _run_eager(self, exc: BaseException) -> None:
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

    def use_adapter(self, loaded: LoadedPipeline, adapter: str | None, scale: float) -> None:
        """Make ``adapter`` (or none) the one merged into the weights at ``scale``; load it the
        first time it is named (see :mod:`worker.pipelines.adapters` for why merged)."""
        if adapter is None:
            if loaded.merged is not None:
                loaded.merged.use(None, scale)
            return
        if loaded.merged is None:
            loaded.merged = MergedAdapters(loaded.pipe)
        name = loaded.adapters.get(adapter)
        if name is None:
            loaded.merged.restore()  # the new adapter wraps pristine weights
            name = self._load_adapter(loaded, adapter)
        loaded.merged.use(name, scale)

    def _load_adapter(self, loaded: LoadedPipeline, adapter: str) -> str:
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
            loaded.pipe.load_lora_weights(str(source), **kwargs)
        except Exception as exc:
            raise AdapterNotFound(f"adapter {adapter!r} cannot be loaded: {_first_line(exc)}") from exc
        log.info("adapter %s loaded as %s in %.2fs", adapter, name, time.perf_counter() - started)
        loaded.adapters[adapter] = name
        return name


def padding(sizes: set[int]) -> Callable[[int], int]:
    """The batch size to run ``n`` images at: the smallest one compiled that holds them (a tail
    chunk of 3 runs on the graph for 8), else ``n`` itself (a new graph, compiled once)."""

    def pad_to(n: int) -> int:
        return min((size for size in sizes if size >= n), default=n)

    return pad_to


def load_failure(exc: BaseException) -> str:
    """One line a user can act on, for a failed ``from_pretrained``. diffusers' own message is
    several hundred characters long and points at "the stacktrace above", which a user reading
    ``producer status`` does not have (the worker logs it once)."""
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, GatedRepoError) for e in chain):
        return "the repository is gated: accept its licence on the Hub and give the workers HF_TOKEN"
    if any(isinstance(e, RepositoryNotFoundError) for e in chain):
        return "no such repository on the Hugging Face Hub, or a private one: check the id, or give workers HF_TOKEN"
    if any(isinstance(e, LocalEntryNotFoundError | ConnectionError) for e in chain) or "not fully cached" in text:
        presets = ", ".join(MODEL_PRESETS)
        return (
            "not in this worker's cache and not downloadable from here (no network, HF_HUB_OFFLINE, or no such "
            f"repository): check the id and the worker's network, or use a local folder or a preset ({presets})"
        )
    return _first_line(exc)[:300]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__
