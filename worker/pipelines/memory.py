"""How many images one batch may hold on this GPU: measured once, not learnt from OOMs.

A batch's peak memory is the weights resident on the GPU plus what each image needs while it
is denoised and decoded. The first job of a shape measures it: one denoising step at batch 1,
2, 4, ... (eagerly, so no graph is compiled for a probe), each peak read from torch's
allocator, until the next batch would not fit (predicted from the last two, then measured).
The peaks are kept in ``<cache_dir>/memory-profiles.json`` by GPU model, model, size, CFG,
dtype, speed levers and offload mode, so a worker on a GPU model seen before measures nothing
and never starts with an out-of-memory error. With a shared compile cache (``--compile-cache
redis``) they also go to that Redis, as the compiled graphs do: a new host of a GPU model the
fleet has seen measures nothing either (the probes were a third of a cold FP8 start on an H200).
Which batch fits is decided against this worker's own share of the GPU (``--gpu-memory``, else
what is free when it starts).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.pipelines.compile_cache import FleetRedis

log = logging.getLogger("diffq.worker")

GiB = 2**30
#: the share of the worker's memory a planned batch may take: fragmentation of the allocator's
#: cache, cuBLAS/cuDNN workspaces and a compiled graph's buffers live in the rest
HEADROOM = 0.9


@dataclass(frozen=True)
class Budget:
    """The GPU memory this worker may use, in bytes, and the GPU's model name (profiles are per model)."""

    usable: int
    gpu: str

    @classmethod
    def of(cls, device: torch.device, gpu_memory_gib: float = 0.0) -> Budget:
        """What is free on ``device`` plus what this process holds already, capped at
        ``gpu_memory_gib`` (0: no cap). The cap is also set on torch's allocator, so an
        allocation past it fails here as it would on a GPU of that size."""
        # the allocator's cap takes an index: "cuda" is the current device (the pinned one)
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        free, total = torch.cuda.mem_get_info(device)
        usable = free + torch.cuda.memory_reserved(device)
        if gpu_memory_gib > 0:
            cap = int(gpu_memory_gib * GiB)
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
            usable = min(usable, cap)
        return cls(usable=usable, gpu=torch.cuda.get_device_name(device))

    def fits(self, peak: int) -> bool:
        return peak <= HEADROOM * self.usable

    def describe(self) -> str:
        return f"{self.usable / GiB:.1f} GiB of {self.gpu}"


#: Redis key prefix of the fleet's profiles: one hash per profile key, batch -> peak bytes
REMOTE_PREFIX = "diffq:memory-profile:"


class Profiles:
    """Measured peak bytes per batch size, by profile key, in one JSON file shared by the workers
    of a host (each write re-reads the file, merges and replaces it whole), and in the fleet's
    Redis when there is one (``remote_url``)."""

    def __init__(self, path: Path, remote_url: str | None = None) -> None:
        self.path = path
        self.remote = FleetRedis(remote_url, "memory profiles")
        self._lock = threading.Lock()
        self._known: dict[str, dict[str, int]] = self._read()

    def _read(self) -> dict[str, dict[str, int]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("memory profiles %s unreadable (%s); measuring again", self.path, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def peaks(self, key: str) -> dict[int, int]:
        """The peaks known for ``key``: this host's, else the fleet's (then kept here too)."""
        if key not in self._known:
            fleet = self.remote.call("hgetall", REMOTE_PREFIX + key) or {}
            if fleet:
                self._keep(key, {int(batch): int(peak) for batch, peak in fleet.items()})
        return {int(batch): int(peak) for batch, peak in self._known.get(key, {}).items()}

    def record(self, key: str, batch: int, peak: int) -> None:
        self._keep(key, {batch: peak})
        self.remote.call("hset", REMOTE_PREFIX + key, str(batch), str(peak))

    def _keep(self, key: str, peaks: dict[int, int]) -> None:
        """Merge ``peaks`` into this host's file (re-read first: the host's other workers write it too)."""
        with self._lock:
            data = self._read()
            data.setdefault(key, {}).update({str(batch): peak for batch, peak in peaks.items()})
            self._known = data
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                temp.write_text(json.dumps(data, indent=1, sort_keys=True))
                os.replace(temp, self.path)
            except OSError as exc:  # a read-only cache: measure again next start, run anyway
                log.warning("memory profile not saved to %s: %s", self.path, exc)


def profile_key(gpu: str, model: str, width: int, height: int, cfg: bool, dtype: str, levers: str, offload: str) -> str:
    return f"{gpu}|{model}|{width}x{height}|cfg={int(cfg)}|{dtype}|{levers}|offload={offload}"


def candidates(limit: int) -> list[int]:
    """Batch sizes tried up to ``limit``: powers of two (they divide a chunk of 8 evenly), then
    ``limit`` itself."""
    sizes = []
    size = 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return [*sizes, max(1, limit)]


def largest_batch(
    measure: Callable[[int], int | None], known: dict[int, int], limit: int, budget: Budget,
    remember: Callable[[int, int], None],
) -> tuple[int, int | None]:  # fmt: skip
    """The largest candidate batch up to ``limit`` whose peak fits ``budget``, and that peak.

    Peaks come from ``known`` or are measured (``measure(batch)``: bytes, or None when it ran
    out of memory, and then ``remember``-ed). A batch whose peak, predicted in a line through
    the last two, would not fit is not tried. Once two are measured and the line says ``limit``
    fits, ``limit`` is measured next: when it fits, the sizes between are never probed (each
    probe of an FP8 SDXL took 20-27 s on an H200); when not, they are, as before. Batch 1 is the
    answer even when it does not fit: the job then fails with a clear out-of-memory message
    rather than never running."""
    best, best_peak = 1, known.get(1)
    seen: list[tuple[int, int]] = []
    refused: set[int] = set()  # sizes measured past the budget (or out of memory)

    def predicted(size: int) -> float | None:
        if len(seen) < 2:
            return None
        (b0, p0), (b1, p1) = seen[-2], seen[-1]
        return p1 + (p1 - p0) * (size - b1) / (b1 - b0)

    def peak_of(size: int) -> int | None:
        peak = known.get(size)
        if peak is None:
            peak = measure(size)
            if peak is not None:
                remember(size, peak)
        if peak is None or not budget.fits(peak):
            refused.add(size)
        return peak

    for size in candidates(limit):
        if size in refused:
            break
        guess = predicted(size)
        if size not in known and guess is not None and not budget.fits(int(guess)):
            break
        peak = peak_of(size)
        if size == 1 and peak is not None:
            best_peak = peak  # the log shows it even when it does not fit
        if peak is None or not budget.fits(peak):
            break
        best, best_peak = size, peak
        seen.append((size, peak))
        jump = predicted(limit)
        if len(seen) == 2 and size < limit and jump is not None and (limit in known or budget.fits(int(jump))):
            top = peak_of(limit)
            if top is not None and budget.fits(top):
                return limit, top
    return best, best_peak


def measure_peak(device: torch.device, run: Callable[[int], object]) -> Callable[[int], int | None]:
    """``measure(batch)`` for :func:`largest_batch`: the peak bytes of tensors while ``run(batch)``
    runs; None on an out-of-memory error. Allocated, not reserved: with memory to spare torch's
    allocator keeps freed blocks cached (reserved 15.6 GiB against 10.6 allocated for a batch of
    2 at 1024² on an H100), and under a cap it frees them before it fails."""
    from worker.pipelines.generate import is_oom

    def measure(batch: int) -> int | None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            with torch.compiler.set_stance("force_eager"):
                run(batch)
            torch.cuda.synchronize(device)
        except Exception as exc:
            if not is_oom(exc):
                raise
            torch.cuda.empty_cache()
            log.info("memory probe: batch %d does not fit", batch)
            return None
        peak = torch.cuda.max_memory_allocated(device)
        log.info("memory probe: batch %d peaks at %.2f GiB", batch, peak / GiB)
        return peak

    return measure
