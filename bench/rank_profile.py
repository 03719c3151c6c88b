"""One steady-state group call under ``torch.profiler``, summarised per rank: where a rank's
wall time goes (compute kernels, collectives that compute does not hide, the GPU idle between
kernels), kernel time by kind, and the text encoders and the VAE timed around their calls.

Used by ``bench/group.py --profile DIR``; each rank writes ``DIR/rank<N>.json`` and a gzipped
Chrome trace ``DIR/rank<N>.trace.json.gz`` (open it in Perfetto).
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

COLLECTIVES = (  # NCCL kernel names, by operation
    ("all_to_all", ("alltoall", "all_to_all")),
    ("all_gather", ("allgather", "all_gather")),
    ("all_reduce", ("allreduce", "all_reduce")),
    ("broadcast", ("broadcast",)),
    ("send_recv", ("sendrecv", "send", "recv")),
)
KINDS = [  # first match wins (compute kernels only)
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    # cuDNN's convolutions are implicit GEMMs ("sm90_xmma_fprop_implicit_gemm_..."), so before
    # "gemm"; the NCHW/NHWC transposes cuDNN runs around them belong to them too
    (
        "convolution",
        ("fprop", "dgrad", "wgrad", "implicit_gemm", "winograd", "convolve", "nchwtonhwc", "nhwctonchw", "conv2d_fp8"),
    ),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "ampere_", "sm80_", "cublas", "nvjet")),
    ("normalization", ("norm", "welford")),
    ("copy", ("memcpy", "memset", "copy", "cat", "transpose")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce", "silu", "gelu", "softmax", "add", "mul")),
]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


#: kernels named per kind in a summary's ``top_kernels``
TOP = 6
#: the copy engines' pull of a ring's peers (worker/group/peer_gather.py): peer-to-peer copies and
#: symmetric memory's barrier kernel; counted as a collective, so that its unhidden time shows
PULL = ("memcpy ptop", "barrier_kernel")


def collective_of(name: str) -> str | None:
    low = name.lower()
    if any(needle in low for needle in PULL):
        return "pull"
    if "nccl" not in low:
        return None
    return next((op for op, needles in COLLECTIVES if any(n in low for n in needles)), "other_nccl")


def kind_of(name: str) -> str:
    """The kind of one kernel, by its name. Inductor's kernels are named after the ops they fused
    (``triton_poi_fused_convolution_native_group_norm_silu_1`` is a pointwise kernel, not a
    convolution): a template is a GEMM, the rest normalization or elementwise. Until 2026-11-26
    cuDNN's convolutions were counted as GEMMs and such fusions as convolutions."""
    low = name.lower()
    if low.startswith("triton_"):
        if low.startswith("triton_tem"):
            return "gemm"
        return "normalization" if "norm" in low else "elementwise"
    return next((kind for kind, needles in KINDS if any(n in low for n in needles)), "other")


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


class Timed:
    """Wraps ``owner.name`` so each call is timed with a device sync on both sides."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.seconds, self.calls = owner, name, 0.0, 0
        self.original: Callable[..., Any] = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            sync()
            started = time.perf_counter()
            with torch.profiler.record_function(f"diffq:{name}"):
                result = self.original(*args, **kwargs)
            sync()
            self.seconds += time.perf_counter() - started
            self.calls += 1
            return result

        setattr(owner, name, timed)

    def restore(self) -> None:
        setattr(self.owner, self.name, self.original)


def profile_call(call: Callable[[], Any], pipe: Any, rank: int, out: Path) -> dict[str, Any]:
    """Run ``call`` once under the profiler and summarise this rank's GPU time."""
    target = getattr(pipe, "module", pipe)
    timers = [Timed(target, "encode_prompt")]
    vae = getattr(target, "vae", None)
    if vae is not None:
        timers.append(Timed(vae, "decode"))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync()
    with torch.profiler.profile(activities=activities) as prof:
        started = time.perf_counter()
        call()
        sync()
        wall_s = time.perf_counter() - started
    for timer in timers:
        timer.restore()
    # the GPU timeline also holds each ``record_function`` range (``diffq:decode`` ...): not kernels.
    # Until 2026-11-28 (``fluxwhere``) they were counted, as "other" and inside compute's union
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("diffq:")
    ]
    compute = [(e.time_range.start, e.time_range.end) for e in kernels if collective_of(e.name) is None]
    comm = [(e.time_range.start, e.time_range.end) for e in kernels if collective_of(e.name) is not None]
    busy_s = union_us(compute + comm) / 1e6
    compute_s = union_us(compute) / 1e6
    by_kind: dict[str, float] = {}
    by_collective: dict[str, float] = {}
    by_name: dict[tuple[str, str], list[float]] = {}  # (kind, kernel name) -> [seconds, calls]
    for e in kernels:
        seconds = (e.time_range.end - e.time_range.start) / 1e6
        op = collective_of(e.name)
        if op is None:
            by_kind[kind_of(e.name)] = by_kind.get(kind_of(e.name), 0.0) + seconds
            named = by_name.setdefault((kind_of(e.name), e.name[:100]), [0.0, 0])
            named[0] += seconds
            named[1] += 1
        else:
            by_collective[op] = by_collective.get(op, 0.0) + seconds
    summary = {
        "rank": rank,
        "wall_s": round(wall_s, 4),
        "gpu_busy_s": round(busy_s, 4),
        "compute_s": round(compute_s, 4),
        "collectives_kernel_s": round(sum(by_collective.values()), 4),
        "collectives_exposed_s": round(busy_s - compute_s, 4),  # collective time no compute kernel overlaps
        "gpu_idle_s": round(wall_s - busy_s, 4),  # launch gaps, host work, waiting on the other rank
        "kernel_s_by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items())},
        "collective_s_by_op": {k: round(v, 4) for k, v in sorted(by_collective.items())},
        "kernels": len(kernels),
        # each kind's heaviest kernels by name: [name, seconds, calls]
        "top_kernels": {
            kind: [
                [name, round(sec, 4), calls]
                for (_, name), (sec, calls) in sorted(
                    ((key, v) for key, v in by_name.items() if key[0] == kind), key=lambda kv: -kv[1][0]
                )[:TOP]
            ]
            for kind in sorted(by_kind)
        },
        **{f"{t.name}_s": round(t.seconds, 4) for t in timers},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(summary, indent=1))
    trace = out / f"rank{rank}.trace.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()
    return summary
