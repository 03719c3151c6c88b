"""Measured figures in README and docs, from one source: the raw lines in ``bench/results/``.

A page writes a figure as ``<!-- fig NAME -->TEXT<!-- /fig -->`` (the comments do not render);
TEXT is what :data:`FIGURES` computes for NAME from the results files. ``make docs`` rewrites
every figure from the files; ``make lint`` runs ``--check``, which prints ``FILE:LINE: NAME says
TEXT, bench/results gives VALUE`` for each figure that drifted, or names an unknown figure, and
exits 1. A new measurement is a new results file and a new entry here, never a number typed
into a page.

    python bench/figures.py --check     # make lint
    python bench/figures.py --write     # make docs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FIGURE = re.compile(r"<!-- fig ([\w.-]+) -->(.*?)<!-- /fig -->")


@cache
def _lines(name: str) -> tuple[dict[str, Any], ...]:
    path = RESULTS / name
    return tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())


def _one(name: str, **match: Any) -> dict[str, Any]:
    """The single line of results file ``name`` whose fields equal ``match``."""
    found = [line for line in _lines(name) if all(line.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise LookupError(f"{name}: {len(found)} lines match {match}, not 1")
    return found[0]


def _rate(name: str, tag: str) -> float:
    return _one(name, tag=tag, kind="queue")["steady_img_per_s"]


def _pair(prefix: str, name: str, base: str, fp8: str, base_word: str = "fp16") -> dict[str, Callable[[], str]]:
    """A call's baseline rate, its fp8 rate and the gain, as ``<prefix>.<base_word>``, ``.fp8``, ``.gain``."""
    return {
        f"{prefix}.{base_word}": lambda: f"{_rate(name, base):.3f}",
        f"{prefix}.fp8": lambda: f"{_rate(name, fp8):.3f}",
        f"{prefix}.gain": lambda: f"{_rate(name, fp8) / _rate(name, base):.2f}×",
    }


def _fp8(machine: str) -> dict[str, Callable[[], str]]:
    name = {"h100": "h100-fp8-call1.jsonl", "h200": "h200-fp8-call1.jsonl"}[machine]
    return _pair(f"fp8.{machine}", name, "fp16", "fp8") | {
        f"fp8.{machine}.psnr": lambda: f"{_one(name, kind='quality')['psnr_mean_db']:.1f} dB",
    }


#: the newest calls through the queue with the overlapped writer (the default since 2026-11-24)
QUEUE_CALLS = ("h100-fp8-call1.jsonl", "h200-fp8-call1.jsonl", "h100-fp8-chunk16.jsonl")


def _queue_share() -> str:
    shares = [
        line["queue_overhead_frac"] * 100
        for name in QUEUE_CALLS
        for line in _lines(name)
        if line.get("kind") == "queue"
    ]
    return f"{min(shares):.1f}–{max(shares):.1f} %"


def _cold_first_image(precision: str) -> str:
    """Launch to first image on a machine with empty caches (every call in QUEUE_CALLS began fresh)."""
    times = [
        line["launch_to_first_image_s"]
        for name in QUEUE_CALLS
        for line in _lines(name)
        if line.get("kind") == "queue" and line.get("precision") == [precision]
    ]
    return f"{min(times):.0f}–{max(times):.0f} s"


#: every call that ran the fp16 defaults through the queue on a cold machine, by GPU
DEFAULTS_CALLS = {
    "h100": [("h100-defaults-call.jsonl", "defaults"), ("h100-rq3-call.jsonl", "defaults"),
             ("h100-adapters-direct-call.jsonl", "defaults"), ("h100-fp8-call1.jsonl", "fp16")],
    "h200": [("h200-defaults-call.jsonl", "defaults"), ("h200-adapters-call.jsonl", "defaults"),
             ("h200-fp8-call1.jsonl", "fp16")],
}  # fmt: skip


def _defaults(machine: str) -> str:
    rates = [_rate(name, tag) for name, tag in DEFAULTS_CALLS[machine]]
    return f"{min(rates):.3f}–{max(rates):.3f}"


def _enqueue_rate() -> str:
    """A new 10^6-row file through ``producer enqueue`` (check pass included), 2 CPU cores."""
    line = _one("campaign-enqueue-1e6.jsonl", event="enqueue alone, new rows (check pass included)")
    return f"10⁶ rows enqueue in {line['seconds']:.0f} s ({line['rows_per_s']:,} rows/s)"


def _demo() -> str:
    """``make demo`` once installed, on the 2-core development machine (bench/demo_time.py)."""
    times = [line["seconds"] for line in _lines("demo-cpu.jsonl") if line["rc"] == 0 and line["images"] == 13]
    return f"{min(times):.0f}–{max(times):.0f} s"


def _first_image(name: str, tag: str) -> str:
    return f"{_one(name, kind='queue', tag=tag)['launch_to_first_image_s']:.1f} s"


def _unet_gain(name: str, base: str, variant: str) -> str:
    """One compiled UNet call's time, ``base`` over ``variant`` (bench/fp8_unet.py --time)."""
    time = {v: _one(name, what="call_time", variant=v)["call_ms"] for v in (base, variant)}
    return f"{time[base] / time[variant]:.2f}×"


def _scaling(gpus: int, name: str = "h200x4-scaling-defaults.jsonl") -> str:
    """N pinned workers through the queue against one, steady (one 4-GPU machine, one call)."""
    return f"{_one(name, gpus=gpus)['steady_img_per_s'] / _one(name, gpus=1)['steady_img_per_s']:.2f}×"


def _group(name: str, one: str, many: str) -> str:
    """A group's image against one GPU's, bare, in the same call."""
    return f"{_one(name, label=one)['s_per_img'] / _one(name, label=many)['s_per_img']:.2f}×"


#: FLUX 1024² on 2 H100s, 2026-11-27: each call's runs of Ulysses 2 (labels without ``flux-u2-``)
SPLIT_CALLS = {
    "fluxprofile": ("compiled", "diffusers-cp", "diffusers-cp-chunks4", "diffusers-cp-chunks4-overlap", "comm-overlap"),
    "fluxcp": ("xdit", "diffusers-cp", "diffusers-cp-p2p32", "diffusers-cp-overlap", "diffusers-cp-graphsteps"),
    "fluxsplit": ("xdit", "product", "product-graphsteps"),
    "fluxoverlap": ("product", "overlap", "overlap-graphsteps", "product-graphsteps"),
    "fluxgraphs": ("nographs", "product"),
}
#: FLUX 1024² on 2 H100s, 2026-11-28: the ring against Ulysses (whole labels, ``flux-`` left out of the figure's name)
RING_CALLS = {
    "fluxring": ("u2-product", "r2-flash-overlap", "r2-cudnn-overlap", "r2-flash", "u2-cudnn", "1gpu-cudnn"),
    "fluxringq": ("r2-product", "u2-product", "r2-nooverlap"),
    "fluxring3": ("r2-product", "r2-cta1", "r2-ch8", "r2-ch16", "r2-product-again"),
    "fluxring4": ("r2-own", "r2-diffusers", "r2-own-again"),
}


def _split_calls() -> dict[str, Callable[[], str]]:
    """``split.<call>.1gpu`` (one compiled GPU's seconds) and ``split.<call>.<run>`` (seconds and
    the speedup over that GPU) for the calls of :data:`SPLIT_CALLS`."""

    def seconds(call: str, label: str) -> float:
        return _one(f"h100x2-{call}-call.jsonl", label=label, kind="group-bare")["s_per_img"]

    def run(call: str, label: str) -> Callable[[], str]:
        one = "flux-1gpu-compiled"
        return lambda: f"{seconds(call, label):.3f} s ({seconds(call, one) / seconds(call, label):.2f}×)"

    out: dict[str, Callable[[], str]] = {}
    for call, runs in SPLIT_CALLS.items():
        out[f"split.{call}.1gpu"] = lambda call=call: f"{seconds(call, 'flux-1gpu-compiled'):.3f} s"
        out |= {f"split.{call}.{r}": run(call, f"flux-u2-{r}") for r in runs}
    for call, runs in RING_CALLS.items():
        out[f"split.{call}.1gpu"] = lambda call=call: f"{seconds(call, 'flux-1gpu-compiled'):.3f} s"
        out |= {f"split.{call}.{r}": run(call, f"flux-{r}") for r in runs}
    return out


def _flux4g() -> dict[str, Callable[[], str]]:
    """FLUX 1024² on 4 H100s as the product splits it (``h100x4-flux4g-call.jsonl``): seconds and
    the speedup over one compiled GPU in the same call; Ulysses 4 through the queue."""
    name = "h100x4-flux4g-call.jsonl"

    def run(label: str) -> Callable[[], str]:
        def text() -> str:
            one, many = (_one(name, label=x, kind="group-bare")["s_per_img"] for x in ("flux-1gpu-compiled", label))
            return f"{many:.3f} s ({one / many:.2f}×)"

        return text

    def queue(field: str) -> float:
        return _one(name, kind="group-queue")[field]

    return {
        "flux4g.1gpu": lambda: f"{_one(name, label='flux-1gpu-compiled')['s_per_img']:.3f} s",
        "flux4g.u4": run("flux-u4-product"),
        "flux4g.u4.nographs": run("flux-u4-nographs"),
        "flux4g.u2": run("flux-u2-product"),
        "flux4g.queue.job": lambda: f"{queue('job_s_median'):.3f} s",
        "flux4g.queue.per-job": lambda: f"{queue('overhead_s_median') / queue('job_s_median'):.1%}".replace("%", " %"),
        "flux4g.queue.run": lambda: f"{queue('queue_overhead_frac'):.1%}".replace("%", " %"),
    }


def _least_a2a(call: str, label: str) -> str:
    """All-to-all kernel seconds per image on the rank that waited least in them (it arrived last,
    so its kernels are the transfer itself), from a ``--profile`` run's line."""
    ranks = _one(f"h100x2-{call}-call.jsonl", label=label, kind="group-profile")["ranks"]
    return f"{min(r['collective_s_by_op']['all_to_all'] for r in ranks):.2f} s"


def _kernels(call: str, label: str, kind: str) -> str:
    """One kind of kernel's seconds per image, the ranks' mean, from a ``--profile`` run's line."""
    ranks = _one(f"h100x2-{call}-call.jsonl", label=label, kind="group-profile")["ranks"]
    return f"{sum(r['kernel_s_by_kind'][kind] for r in ranks) / len(ranks):.2f} s"


def _rank_mean(call: str, label: str, field: str) -> str:
    """One field of a ``--profile`` run's line (seconds per image), the ranks' mean."""
    ranks = _one(f"h100x2-{call}-call.jsonl", label=label, kind="group-profile")["ranks"]
    return f"{sum(r[field] for r in ranks) / len(ranks):.2f} s"


def _queued(call: str) -> dict[str, Callable[[], str]]:
    """``split.<call>.queue`` (overhead over the pipeline call), ``.queue.job`` (median seconds a
    job) and ``.exit`` (the group's exit after the last job) from a call's queue line."""

    def field(name: str) -> float:
        return _one(f"h100x2-{call}-call.jsonl", kind="group-queue")[name]

    return {
        f"split.{call}.queue": lambda: f"{field('queue_overhead_frac'):.1%}".replace("%", " %"),
        f"split.{call}.queue.job": lambda: f"{field('job_s_median'):.3f} s",
        f"split.{call}.exit": lambda: f"{field('exit_after_last_s'):.1f} s",
    }


def _pull() -> dict[str, Callable[[], str]]:
    """The copy engines' pull against NCCL's gather (bench/peer_gather.py; 2 H200s, 2026-11-28):
    beside GEMMs alone (``copygather``), then in a ring of 2 (``fluxring7``, one GPU in the call)."""
    ring = "h200x2-fluxring7-call.jsonl"

    def beside(case: str) -> float:
        return _one("h200x2-copygather-call.jsonl", case=case)["s"] * 1000

    def seconds(label: str) -> float:
        return _one(ring, label=label, kind="group-bare")["s_per_img"]

    def both(label: str) -> Callable[[], str]:
        return lambda: "{:.3f} / {:.3f} s".format(seconds(label), seconds(f"{label}-again"))

    def profiled(field: str) -> Callable[[], str]:
        def text() -> str:
            ranks = _one(ring, label="flux-r2-pull", kind="group-profile")["ranks"]
            return f"{sum(r['kernel_s_by_kind'].get(field, r.get(field, 0.0)) for r in ranks) / len(ranks):.2f} s"

        return text

    return {
        "pull.gemms": lambda: f"{beside('gemms'):.1f} ms",
        "pull.beside.nccl": lambda: f"{beside('nccl+gemms') - beside('gemms'):.1f} ms",
        "pull.beside.pull": lambda: f"{beside('ce+gemms') - beside('gemms'):.1f} ms",
        "pull.1gpu": lambda: f"{seconds('flux-1gpu-compiled'):.3f} s",
        "pull.ring.pull": both("flux-r2-pull"),
        "pull.ring.nccl": both("flux-r2-nccl"),
        "pull.ring.best": lambda: "{:.2f}×".format(
            seconds("flux-1gpu-compiled") / min(seconds(x) for x in ("flux-r2-pull", "flux-r2-pull-again"))
        ),
        "pull.prof.gemm": profiled("gemm"),
        "pull.prof.copy": profiled("copy"),
        "pull.prof.idle": profiled("gpu_idle_s"),
        "pull.prof.exposed": profiled("collectives_exposed_s"),
        "pull.queue": lambda: f"{_one(ring, kind='group-queue')['queue_overhead_frac']:.1%}".replace("%", " %"),
        "pull.queue.job": lambda: f"{_one(ring, kind='group-queue')['job_s_median']:.3f} s",
    }


def _where() -> dict[str, Callable[[], str]]:
    """FLUX 1024² on 2 H200s, 2026-11-28: one GPU and the ring profiled with kernel names
    (``fluxwhere``), the ring's attention on views of tokens-first memory (``fluxring8``), and
    the decoder split by rows against every rank decoding the whole latent (``fluxdecode``)."""
    where, views = "h200x2-fluxwhere-call.jsonl", "h200x2-fluxring8-call.jsonl"
    decode = "h200x2-fluxdecode-call.jsonl"

    def seconds(name: str, label: str) -> float:
        return _one(name, label=label, kind="group-bare")["s_per_img"]

    def mean(name: str, label: str, read: Callable[[dict[str, Any]], float]) -> str:
        ranks = _one(name, label=label, kind="group-profile")["ranks"]
        return f"{sum(read(r) for r in ranks) / len(ranks):.2f} s"

    def named(rank: dict[str, Any], kind: str, prefix: str) -> float:
        return sum(s for name, s, _ in rank["top_kernels"][kind] if name.startswith(prefix))

    def both(label: str) -> Callable[[], str]:
        return lambda: "{:.3f} / {:.3f} s".format(seconds(views, label), seconds(views, f"{label}-again"))

    def against_one(name: str, label: str) -> str:
        """A run and its ``-again``: seconds, then each one's speedup over the call's one GPU."""
        runs = [seconds(name, x) for x in (label, f"{label}-again")]
        one = seconds(name, "flux-1gpu-compiled")
        return "{:.3f} / {:.3f} s ({:.2f}× / {:.2f}×)".format(*runs, *(one / r for r in runs))

    return {
        "where.1gpu": lambda: f"{seconds(where, 'flux-1gpu-compiled'):.3f} s",
        "where.ring": lambda: "{:.3f} s ({:.2f}×)".format(
            seconds(where, "flux-r2-product"), seconds(where, "flux-1gpu-compiled") / seconds(where, "flux-r2-product")
        ),
        "where.gemm.1gpu": lambda: mean(where, "flux-1gpu-compiled", lambda r: r["kernel_s_by_kind"]["gemm"]),
        "where.gemm.ring": lambda: mean(where, "flux-r2-product", lambda r: r["kernel_s_by_kind"]["gemm"]),
        "where.groupnorm": lambda: mean(
            where,
            "flux-r2-product",
            lambda r: named(r, "other", "void at::native::(anonymous namespace)::RowwiseMom"),
        ),
        "where.decode": lambda: mean(where, "flux-r2-product", lambda r: r["decode_s"]),
        "trace.idle": lambda: f"{_one('h200x2-fluxtrace-call.jsonl', kind='trace-gaps')['idle_s'] * 1000:.0f} ms",
        "trace.tiny": lambda: "{:.0f} ms in {:,} gaps".format(
            _one("h200x2-fluxtrace-call.jsonl", kind="trace-gaps")["idle_s_by_gap"]["<5us"] * 1000,
            _one("h200x2-fluxtrace-call.jsonl", kind="trace-gaps")["gaps_by_size"]["<5us"],
        ),
        "trace.long": lambda: "{:.0f} ms".format(
            _one("h200x2-fluxtrace-call.jsonl", kind="trace-gaps")["idle_s_by_gap"][">=1ms"] * 1000
        ),
        "decode.1gpu": lambda: f"{seconds(decode, 'flux-1gpu-compiled'):.3f} s",
        "decode.split": lambda: against_one(decode, "flux-r2-splitdecode"),
        "decode.whole": lambda: against_one(decode, "flux-r2-wholedecode"),
        "decode.speedups": lambda: "{:.2f}-{:.2f}×".format(
            *sorted(
                seconds(decode, "flux-1gpu-compiled") / seconds(decode, x)
                for x in ("flux-r2-splitdecode", "flux-r2-splitdecode-again")
            )
        ),
        "decode.peak": lambda: "{:.2f} GiB against {:.2f}".format(
            *(_one(decode, label=x)["peak_gib"] for x in ("flux-r2-splitdecode", "flux-r2-wholedecode"))
        ),
        "decode.2048": lambda: f"{seconds(decode, 'flux-2048-r2-splitdecode'):.3f} s",
        "decode.2048.peak": lambda: "{:.2f} GiB against {:.2f}".format(
            _one(decode, label="flux-2048-r2-splitdecode")["peak_gib"],
            _one("h100x2-fluxring5-call.jsonl", label="flux-2048-r2-own")["peak_gib"],
        ),
        "bshd.1gpu": lambda: f"{seconds(views, 'flux-1gpu-compiled'):.3f} s",
        "bshd.views": both("flux-r2-bshd"),
        "bshd.copies": both("flux-r2-bhsd"),
        "bshd.norm": lambda: mean(views, "flux-r2-bshd", lambda r: r["kernel_s_by_kind"]["normalization"]),
        "bshd.norm.copies": lambda: mean(where, "flux-r2-product", lambda r: r["kernel_s_by_kind"]["normalization"]),
    }


def _modulation() -> dict[str, Callable[[], str]]:
    """``modulation-once`` against the same levers without it, alternated in one call
    (``fluxmod``; one H200 on 2026-11-28, when no pair was lent), and a FLUX single worker
    through the queue with ``auto`` as it was and as it is (``fluxworker``)."""
    name = "h200-fluxmod-call.jsonl"

    def runs(label: str) -> list[float]:
        return [_one(name, label=x, kind="group-bare")["s_per_img"] for x in (label, f"{label}-again")]

    def saved() -> str:
        without, with_ = runs("flux-1gpu-compiled"), runs("flux-1gpu-modonce")
        gain = sum(without) / 2 - sum(with_) / 2
        return f"{gain:.2f} s ({gain / (sum(without) / 2):.1%})".replace("%", " %")

    def worker(tag: str) -> dict[str, Any]:
        return _one("h200-fluxworker-call.jsonl", kind="queue", tag=tag)

    def steady(tag: str) -> str:
        rate = worker(tag)["steady_after_last_compile_img_per_s"]
        return f"{rate:.3f} img/s ({1 / rate:.2f} s an image)"

    return {
        "worker.flux.before": lambda: steady("flux-worker-before"),
        "worker.flux.auto": lambda: steady("flux-worker-auto"),
        "worker.flux.gain": lambda: "{:.2f}×".format(
            worker("flux-worker-auto")["steady_after_last_compile_img_per_s"]
            / worker("flux-worker-before")["steady_after_last_compile_img_per_s"]
        ),
        "mod.1gpu.without": lambda: "{:.3f} / {:.3f} s".format(*runs("flux-1gpu-compiled")),
        "mod.1gpu.with": lambda: "{:.3f} / {:.3f} s".format(*runs("flux-1gpu-modonce")),
        "mod.1gpu.saved": saved,
    }


def _modring() -> dict[str, Callable[[], str]]:
    """``modulation-once`` in the ring of 2 on 2 H200s (``fluxmod``, alternated, each ring run
    against one GPU with the same levers in the same call), the ring as one attention over all
    keys (the experiment), and the product after it profiled and queued (``fluxmodq``)."""
    mod, modq = "h200x2-fluxmod-call.jsonl", "h200x2-fluxmodq-call.jsonl"

    def seconds(name: str, label: str) -> float:
        return _one(name, label=label, kind="group-bare")["s_per_img"]

    def pair(label: str, one: float) -> str:
        runs = [seconds(mod, x) for x in (label, f"{label}-again")]
        return "{:.3f} / {:.3f} s ({:.2f}× / {:.2f}×)".format(*runs, *(one / r for r in runs))

    def one_with() -> float:
        return (seconds(mod, "flux-1gpu-modonce") + seconds(mod, "flux-1gpu-modonce-again")) / 2

    def kernel(label: str, prefix: str) -> str:
        ranks = _one(modq, label=label, kind="group-profile")["ranks"]
        found = [sum(s for n, s, _ in r["top_kernels"]["elementwise"] if n.startswith(prefix)) for r in ranks]
        return f"{sum(found) / len(found):.2f} s"

    def queued(field: str) -> float:
        return _one(modq, kind="group-queue")[field]

    return {
        "modring.1gpu.without": lambda: f"{seconds(mod, 'flux-1gpu-compiled'):.3f} s",
        "modring.1gpu.with": lambda: "{:.3f} / {:.3f} s".format(
            seconds(mod, "flux-1gpu-modonce"), seconds(mod, "flux-1gpu-modonce-again")
        ),
        "modring.without": lambda: pair("flux-r2-without", seconds(mod, "flux-1gpu-compiled")),
        "modring.with": lambda: pair("flux-r2-modonce", one_with()),
        "modring.whole": lambda: pair("flux-r2-whole", one_with()),
        "modq.1gpu": lambda: f"{seconds(modq, 'flux-1gpu-modonce'):.3f} s",
        "modq.ring": lambda: "{:.3f} s ({:.2f}×)".format(
            seconds(modq, "flux-r2-product"), seconds(modq, "flux-1gpu-modonce") / seconds(modq, "flux-r2-product")
        ),
        "modq.gemm.1gpu": lambda: _rank_kind(modq, "flux-1gpu-modonce", "gemm"),
        "modq.gemm.ring": lambda: _rank_kind(modq, "flux-r2-product", "gemm"),
        "modq.catgelu.1gpu": lambda: kernel("flux-1gpu-modonce", "triton_poi_fused_cat_gelu"),
        "modq.catgelu.ring": lambda: kernel("flux-r2-product", "triton_poi_fused__to_copy__unsafe_view_cat_clone_gelu"),
        "modq.queue.job": lambda: f"{queued('job_s_median'):.3f} s",
        "modq.queue": lambda: f"{queued('queue_overhead_frac'):.1%}".replace("%", " %"),
        "modq.exit": lambda: f"{queued('exit_after_last_s'):.1f} s",
    }


def _merge() -> dict[str, Callable[[], str]]:
    """The ring's last merge as one kernel (``fluxmerge``, 2 H200s, alternated) against the
    merge fused by Inductor (``--ring-torch-merge``), each against one GPU in the same call; the
    kernel's run profiled; the ring through the queue after it. The first call
    (``h200x2-fluxmerge-call``) ran the op before its ``flexible_layout`` tag."""
    name, first = "h200x2-fluxmerge2-call.jsonl", "h200x2-fluxmerge-call.jsonl"

    def seconds(label: str, source: str = name) -> float:
        return _one(source, label=label, kind="group-bare")["s_per_img"]

    def pair(label: str, source: str = name) -> str:
        one = seconds("flux-1gpu-compiled", source)
        runs = [seconds(x, source) for x in (label, f"{label}-again")]
        return "{:.3f} / {:.3f} s ({:.2f}× / {:.2f}×)".format(*runs, *(one / r for r in runs))

    def kernel(kind: str, prefix: str, source: str = name) -> str:
        ranks = _one(source, label="flux-r2-mergekernel", kind="group-profile")["ranks"]
        found = [sum(s for n, s, _ in r["top_kernels"][kind] if n.startswith(prefix)) for r in ranks]
        return f"{sum(found) / len(found):.3f} s"

    def queued(field: str) -> float:
        return _one(name, kind="group-queue")[field]

    return {
        "merge.1gpu": lambda: f"{seconds('flux-1gpu-compiled'):.3f} s",
        "merge.kernel": lambda: pair("flux-r2-mergekernel"),
        "merge.torch": lambda: pair("flux-r2-torchmerge"),
        "merge.catgelu": lambda: kernel("elementwise", "triton_poi_fused_cat_gelu"),
        "merge.kernel.s": lambda: kernel("other", "merge_kernel"),
        "merge.elementwise": lambda: _rank_kind(name, "flux-r2-mergekernel", "elementwise"),
        "merge.first.kernel": lambda: pair("flux-r2-mergekernel", first),
        "merge.first.torch": lambda: pair("flux-r2-torchmerge", first),
        "merge.first.copies": lambda: kernel("elementwise", "triton_poi_fused_merge_attention", first),
        "merge.queue.job": lambda: f"{queued('job_s_median'):.3f} s",
        "merge.queue": lambda: f"{queued('queue_overhead_frac'):.1%}".replace("%", " %"),
        "merge.exit": lambda: f"{queued('exit_after_last_s'):.1f} s",
    }


def _pairparts() -> dict[str, Callable[[], str]]:
    """An SDXL CFG pair's serial parts at batch 1 on one H200 (``pairparts``): the decoder whole
    and at half rows, the split twin, the prompt's encode; the halo by concatenation before
    (``h200-pairparts-cat-call``, the call before on another H200)."""
    name, before = "h200-pairparts-call.jsonl", "h200-pairparts-cat-call.jsonl"

    def ms(how: str, rows: str | None = None, of: str = name) -> float:
        return _one(of, part="decode" if rows else "encode", how=how, **({"rows": rows} if rows else {}))["ms"]

    twin = "split twin, compiled, 1 rank"
    return {
        "pair.decode.eager": lambda: f"{ms('eager', 'whole'):.1f} / {ms('eager', 'half'):.1f} ms",
        "pair.decode.compiled": lambda: f"{ms('compiled', 'whole'):.1f} / {ms('compiled', 'half'):.1f} ms",
        "pair.decode.rank": lambda: f"{ms('split twin, compiled, rank 0 of 2, exchanges local', 'half'):.1f} ms",
        "pair.decode.compile-diff": lambda: f"{_one(name, how='compiled', rows='whole')['max_diff_255']:.2f}/255",
        "pair.decode.twin-diff": lambda: f"{_one(name, how=twin)['max_diff_255_vs_compiled']:.2f}/255",
        "pair.decode.twin": lambda: f"{ms(twin, 'whole'):.2f} ms against {ms('compiled', 'whole'):.2f}",
        "pair.decode.twin-cat": lambda: (
            f"{ms(twin, 'whole', before):.2f} ms against {ms('compiled', 'whole', before):.2f}"
        ),
        "pair.encode": lambda: f"{ms('eager'):.1f} → {ms('compiled'):.1f} ms",
        "pair.encode.before": lambda: f"{ms('eager', of=before):.1f} → {ms('compiled', of=before):.1f} ms",
    }


def _decodemem() -> dict[str, Callable[[], str]]:
    """FLUX's decoder (bf16) on one H200 (``decodemem``): the whole decode against a pair's rank
    (its exchanges local) and the one-rank twin, the split GroupNorm in parts (the product) and
    over the whole activation (before), alternated; then compiled."""
    name = "h200-decodemem-call.jsonl"

    def runs(size: int, how: str, groupnorm: str | None, compiled: bool = False) -> list[dict[str, Any]]:
        return [x for x in _lines(name) if x["size"] == size and x["how"] == how and x.get("groupnorm") == groupnorm
                and x.get("compiled") == compiled and "peak_mib" in x]  # fmt: skip

    def ms(size: int, how: str, groupnorm: str | None, compiled: bool = False) -> str:
        return " / ".join(f"{x['ms']:.1f}" for x in runs(size, how, groupnorm, compiled)) + " ms"

    def peak(size: int, how: str, groupnorm: str | None, compiled: bool = False) -> str:
        (mib,) = {x["peak_mib"] for x in runs(size, how, groupnorm, compiled)}  # the same on every run
        return f"{mib:,.0f} MiB"

    rank, twin = "rank 0 of 2, exchanges local", "twin, 1 rank"
    out: dict[str, Callable[[], str]] = {}
    for size in (1024, 2048):
        out |= {
            f"decodemem.{size}.whole": lambda s=size: f"{peak(s, 'whole', None)}, {ms(s, 'whole', None)}",
            f"decodemem.{size}.rank": lambda s=size: f"{peak(s, rank, 'parts')}, {ms(s, rank, 'parts')}",
            f"decodemem.{size}.rank.before": lambda s=size: (
                f"{peak(s, rank, 'whole activation')}, {ms(s, rank, 'whole activation')}"
            ),
            f"decodemem.{size}.twin": lambda s=size: f"{ms(s, twin, 'parts')}",
            f"decodemem.{size}.twin.before": lambda s=size: f"{peak(s, twin, 'whole activation')}",
            f"decodemem.{size}.compiled": lambda s=size: (
                f"{peak(s, 'whole', None, True)}, {ms(s, 'whole', None, True)}"
            ),
            f"decodemem.{size}.compiled.rank": lambda s=size: (
                f"{peak(s, rank, 'compiled', True)}, {ms(s, rank, 'compiled', True)}"
            ),
            f"decodemem.{size}.compiled.eager": lambda s=size: (  # the compiled run's process, before its compile
                "".join(f"{x['ms']:.1f} ms" for x in _lines(name) if x["size"] == s and "peak_mib" not in x)
            ),
            f"decodemem.{size}.compiled.diff": lambda s=size: (
                f"{_one(name, size=s, how='whole', compiled=True, groupnorm=None)['max_diff_255_vs_eager']:.2f}/255"
            ),
        }
    out["decodemem.parts8.1024"] = lambda: (
        " / ".join(  # the call before: 8 parts at every size
            f"{x['ms']:.1f}"
            for x in _lines("h200-decodemem-parts8-call.jsonl")
            if x["size"] == 1024 and x["how"] == rank and x["groupnorm"] == "parts"
        )
        + " ms"
    )
    out["decodemem.twin.diff"] = lambda: (
        "/".join(
            sorted({f"{x['max_diff_255']:.2f}" for x in _lines(name) if x["how"] == twin and x["groupnorm"] == "parts"})
        )
        + "/255"
    )
    return out


def _ringcalls() -> dict[str, Callable[[], str]]:
    """A ring rank's attention kernels on one H200 (``ringcalls``, bench/ring_calls.py): two
    cuDNN calls of half the keys and the merge against one call of all of them, and one GPU's
    whole attention, one step's 57 layers as one CUDA graph; then the issue's first pair call
    timed on the same GPU (``done2``/``done2c`` with the pair's runs failing at once)."""
    name = "h200-ringcalls-call.jsonl"

    def ms(size: int, way: str) -> float:
        return _one(name, bench="ring_calls", size=size, way=way)["ms_per_layer"]

    def image(size: int, way: str) -> float:
        return _one(name, bench="ring_calls", size=size, way=way)["s_per_image"]

    figures: dict[str, Callable[[], str]] = {}
    for size in (1024, 2048):
        figures |= {
            f"ringcalls.{size}.calls": lambda z=size: (
                f"{ms(z, 'ring-product'):.3f} → {ms(z, 'whole-heads-first'):.3f} ms"
            ),
            f"ringcalls.{size}.views": lambda z=size: f"{ms(z, 'whole-views'):.3f} ms",
            f"ringcalls.{size}.image": lambda z=size: (
                f"{image(z, 'ring-product'):.3f} → {image(z, 'whole-heads-first'):.3f} s"
            ),
            f"ringcalls.{size}.half": lambda z=size: f"{ms(z, '1gpu-cudnn') / 2:.3f} ms",
            f"ringcalls.{size}.over-half": lambda z=size: (
                f"{ms(z, 'whole-heads-first') / (ms(z, '1gpu-cudnn') / 2) - 1:.0%}"
            ),
            f"ringcalls.{size}.flash": lambda z=size: (
                f"{ms(z, '1gpu-flash'):.3f} ms against cuDNN's {ms(z, '1gpu-cudnn'):.3f} ms"
            ),
        }
    return figures


def _ratio_text(name: str, one: str, many: str) -> str:
    """One GPU's image against a group's, bare, in the same call: both times and the ratio."""
    a, b = _one(name, label=one)["s_per_img"], _one(name, label=many)["s_per_img"]
    return f"{a:.3f} → {b:.3f} s ({a / b:.2f}×)"


def _group_queue(name: str) -> dict[str, Any]:
    """The call's one group-through-the-queue line, refused unless every job's images were made."""
    line = _one(name, kind="group-queue")
    if line["rc"] != 0 or line["images"] != line["jobs"] * line["chunk"]:
        raise LookupError(f"{name}: the group exited {line['rc']} with {line['images']} images")
    return line


def _done2() -> dict[str, Callable[[], str]]:
    """Issue 46's "done means" on a pair of H200s (2026-11-29, three calls back to back on one
    machine): SDXL at batch 1 (``done2``), FLUX 1024² and 2048² (``done2b``), SDXL at batch 4
    (``done2c``), each pair against one GPU in the same call; the groups through the queue."""
    b1, flux, b4 = "h200x2-done2-call.jsonl", "h200x2-done2b-call.jsonl", "h200x2-done2c-call.jsonl"

    def run(name: str, label: str) -> dict[str, Any]:
        return _one(name, label=label)

    ratio = _ratio_text

    def calls(name: str, label: str) -> str:
        return " / ".join(f"{c:.3f}" for c in run(name, label)["calls"])

    def queue_text(name: str) -> str:
        q = _group_queue(name)
        return (
            f"{q['job_s_median']:.3f} s a job, the queue {q['overhead_s_median'] / q['job_s_median']:.1%} of it, "
            f"{q['queue_overhead_frac']:.1%} over the run"
        ).replace("%", " %")

    def diff(name: str, label: str) -> str:
        return f"{run(name, label)['max_pixel_diff_255']}/255"

    return {
        "done2.b1.worker": lambda: ratio(b1, "sdxl-1gpu-worker-levers", "sdxl-cfg2"),
        "done2.b1.worker.calls": lambda: calls(b1, "sdxl-1gpu-worker-levers"),
        "done2.b1.pair-levers": lambda: ratio(b1, "sdxl-1gpu-pair-levers", "sdxl-cfg2"),
        "done2.b1.pair.calls": lambda: calls(b1, "sdxl-cfg2"),
        "done2.b1.diff": lambda: diff(b1, "sdxl-cfg2"),
        "done2.b1.queue": lambda: queue_text(b1),
        "done2.b4": lambda: ratio(b4, "sdxl-1gpu-b4-worker-levers", "sdxl-cfg2-b4"),
        "done2.b4.diff": lambda: diff(b4, "sdxl-cfg2-b4"),
        "done2.flux.1024": lambda: ratio(flux, "flux-1024-1gpu", "flux-1024-r2"),
        "done2.flux.1024.diff": lambda: diff(flux, "flux-1024-r2"),
        "done2.flux.1024.exact": lambda: (
            f"{run(flux, 'flux-1024-1gpu')['s_per_img'] / run(flux, 'flux-1024-r2')['s_per_img']:.3f}×"
        ),
        "done2.flux.1024.decode": lambda: (
            " → ".join(f"{run(flux, label)['phases']['decode_s']:.3f}" for label in ("flux-1024-1gpu", "flux-1024-r2"))
            + " s"
        ),
        "done2.flux.2048": lambda: ratio(flux, "flux-2048-1gpu", "flux-2048-r2"),
        "done2.flux.2048.diff": lambda: diff(flux, "flux-2048-r2"),
        "done2.flux.2048.peak": lambda: (
            f"{run(flux, 'flux-2048-1gpu')['peak_gib']:.2f} → {run(flux, 'flux-2048-r2')['peak_gib']:.2f} GiB"
        ),
        "done2.flux.queue": lambda: queue_text(flux),
        "answergather.1024": lambda: _answer_gather(),
    }


def _done2q() -> dict[str, Callable[[], str]]:
    """Issue 46 on 2 H200s again (2026-11-29, after rank 0's answer stayed in its memory and the
    pipeline's device was pinned): ``done2q``, the SDXL CFG pair at batch 1 against one GPU with
    its levers, bare and through the queue; then data parallel (``bench/e2e_queue.py``, jobs of 4,
    the worker's defaults, graphs compiled by an earlier call on the same machine)."""
    name, dp = "h200x2-done2q-call.jsonl", "h200x2-done2d-call.jsonl"

    def bare() -> float:
        return statistics.median(_one(name, label="sdxl-cfg2")["calls"])

    def queue_text() -> str:
        q, b = _group_queue(name), bare()
        gap = statistics.median(q["gap_between_jobs_s"])
        return (
            f"{q['job_s_median']:.3f} s a job against the bare call's {b:.3f} s (medians; "
            f"+{q['job_s_median'] / b - 1:.1%}, "
            f"with the gap to the next job +{(q['job_s_median'] + gap) / b - 1:.1%}); "
            f"beyond the slowest rank's phases {q['overhead_s_median'] * 1e3:.1f} ms; "
            f"{q['queue_overhead_frac']:.1%} over the run of {q['jobs']} jobs"
        ).replace("%", " %")

    def rate(gpus: int) -> float:
        return _one(dp, gpus=gpus)["steady_img_per_s"]

    def one_and_pair() -> tuple[dict[str, Any], dict[str, Any]]:
        return _one(name, label="sdxl-1gpu-pair-levers"), _one(name, label="sdxl-cfg2")

    def denoise_text() -> str:  # the UNet's share alone
        one, pair = one_and_pair()
        d1, d2 = one["phases"]["denoise_s"], pair["phases"]["denoise_s"]
        return f"{d1:.3f} → {d2:.3f} s ({d1 / d2:.2f}×"

    def bound_text() -> str:  # the ratio were the pair's encode and decode free
        one, pair = one_and_pair()
        return f"{one['s_per_img'] / pair['phases']['denoise_s']:.2f}×"

    return {
        "done2q.b1": lambda: _ratio_text(name, "sdxl-1gpu-pair-levers", "sdxl-cfg2"),
        "done2q.b1.calls": lambda: " / ".join(f"{c:.3f}" for c in _one(name, label="sdxl-cfg2")["calls"]),
        "done2q.b1.diff": lambda: f"{_one(name, label='sdxl-cfg2')['max_pixel_diff_255']}/255",
        "done2q.queue": queue_text,
        "done2q.save": lambda: f"{_group_queue(name)['timings_median']['save_s']:.3f} s",
        "done2q.denoise": denoise_text,
        "done2q.bound": bound_text,
        "done2q.dp": lambda: f"{rate(1):.3f} → {rate(2):.3f} img/s ({rate(2) / rate(1):.2f}×)",
    }


def _rounding2() -> dict[str, Callable[[], str]]:
    """A FLUX image's pixels rounded on the device against on the host as diffusers' PIL output
    did, alternated call by call in one process (``rounding2``, 2 H200s, 2026-11-29): one GPU
    with the ring's levers and the ring of 2, at 1024² (4 calls each) and 2048² (1 each)."""
    name = "h200x2-rounding2-call.jsonl"

    def kinds(label: str) -> tuple[dict[str, Any], dict[str, Any]]:
        line = _one(name, label=label)
        return line["host_rounding"], line["device_rounding"]

    def image(label: str) -> str:  # medians: the calls alternated, so the spread is each kind's
        host, device = kinds(label)
        med = statistics.median
        return (
            f"{med(host['calls']):.3f} → {med(device['calls']):.3f} s "
            f"(decode {med(host['decode_s']) * 1e3:.0f} → {med(device['decode_s']) * 1e3:.0f} ms)"
        )

    def decode(label: str) -> str:
        host, device = kinds(label)
        return f"{host['decode_s'][0] * 1e3:.0f} → {device['decode_s'][0] * 1e3:.0f} ms"

    def ratio(kind: str) -> str:  # one GPU's best call against the ring's, each kind alone
        one, ring = (_one(name, label=f"flux-1024-{x}-rounding")[kind] for x in ("1gpu", "r2"))
        return f"{one['s_per_img']:.3f} → {ring['s_per_img']:.3f} s ({one['s_per_img'] / ring['s_per_img']:.3f}×)"

    return {
        "rounding.1024.1gpu": lambda: image("flux-1024-1gpu-rounding"),
        "rounding.1024.ring": lambda: image("flux-1024-r2-rounding"),
        "rounding.1024.ratio.host": lambda: ratio("host_rounding"),
        "rounding.1024.ratio.device": lambda: ratio("device_rounding"),
        "rounding.1024.diff": lambda: f"{_one(name, label='flux-1024-r2-rounding')['max_pixel_diff_255']}/255",
        "rounding.2048.1gpu.decode": lambda: decode("flux-2048-1gpu-rounding"),
        "rounding.2048.ring.decode": lambda: decode("flux-2048-r2-rounding"),
        "rounding.2048.calls": lambda: " / ".join(
            f"{kinds(f'flux-2048-{x}-rounding')[i]['calls'][0]:.3f}" for x in ("1gpu", "r2") for i in (0, 1)
        ),
    }


def _fusering() -> dict[str, Callable[[], str]]:
    """``fuse-qkv`` on the FLUX ring of 2, 2 H200s, 2026-11-29: ``fluxfusering`` (one GPU, the ring
    without, with, without again; the second with it died at load), ``fusering2`` (one GPU
    without and with it, the ring with it cold and warm twice, without it between) and
    ``fusestarts`` (the ring with it launched 8 times, one image each); ``fuse2048`` (2048², one GPU
    against the ring with its defaults, one call each)."""
    first, second = "h200x2-fluxfusering-call.jsonl", "h200x2-fusering2-call.jsonl"
    starts, big = "h200x2-fusestarts-call.jsonl", "h200x2-fuse2048-call.jsonl"

    def s_(name: str, label: str) -> float:
        return _one(name, label=label)["s_per_img"]

    def ratio(one: float, ring: float) -> str:
        return f"{one:.3f} → {ring:.3f} s ({one / ring:.2f}×)"

    def peak(name: str, one: str, ring: str) -> str:
        return f"{_one(name, label=one)['peak_gib']:.2f} → {_one(name, label=ring)['peak_gib']:.2f} GiB"

    def fused2() -> float:  # the best of the call's three processes with the lever
        return min(s_(second, f"flux-r2-fuseqkv{x}") for x in ("", "-warm", "-warm2"))

    def launches() -> str:
        lines = [x for x in _lines(starts) if x["label"].startswith("flux-r2-fuseqkv-start")]
        times = sorted(x["s_per_img"] for x in lines)
        return f"{len(lines)} of 8 launches made their image ({times[0]:.3f}-{times[-1]:.3f} s)"

    return {
        "fusering.1gpu": lambda: f"{s_(second, 'flux-1gpu-compiled'):.3f} → {s_(second, 'flux-1gpu-fuseqkv'):.3f} s",
        "fusering.ring": lambda: f"{s_(second, 'flux-r2-separate'):.3f} → {fused2():.3f} s",
        "fusering.ring.first": lambda: (
            f"{min(s_(first, 'flux-r2-separate'), s_(first, 'flux-r2-separate-again')):.3f} → "
            f"{s_(first, 'flux-r2-fuseqkv'):.3f} s"
        ),
        "fusering.ratio": lambda: ratio(s_(second, "flux-1gpu-compiled"), fused2()),
        "fusering.ratio.without": lambda: ratio(s_(second, "flux-1gpu-compiled"), s_(second, "flux-r2-separate")),
        "fusering.ratio.first": lambda: ratio(s_(first, "flux-1gpu-compiled"), s_(first, "flux-r2-fuseqkv")),
        "fusering.peak": lambda: peak(second, "flux-r2-separate", "flux-r2-fuseqkv"),
        "fusering.diff": lambda: f"{_one(second, label='flux-r2-fuseqkv')['max_pixel_diff_255']}/255",
        "fusering.starts": launches,
        "fusering.2048": lambda: _ratio_text(big, "flux-2048-1gpu", "flux-2048-r2-defaults"),
        "fusering.2048.peak": lambda: peak(big, "flux-2048-1gpu", "flux-2048-r2-defaults"),
    }


def _pinned() -> dict[str, Callable[[], str]]:
    """The pipeline's execution device pinned (worker/pipelines/pinned_device.py), one H200
    (2026-11-29). ``queue1``, before it: a one-rank SDXL group at batch 1 through the queue, rank
    0's main thread timed by part. ``pinned1``: pinned and looked up on every ask, alternated call
    by call in one process (SDXL at batch 1, FLUX 1024²), then SDXL through the queue."""
    before, after = "h200-queue1-call.jsonl", "h200-pinned1-call.jsonl"

    def median(values: list[float]) -> float:
        return statistics.median(values)

    def outside_before() -> str:  # run_split's time beyond the batch's encode, denoise and decode
        timed = [x for x in _lines(before) if x.get("kind") == "timed"][1:]  # the first job compiles
        return f"{median([x['run_split'] - x['phases'] for x in timed]) * 1e3:.1f} ms"

    def alternated(label: str) -> str:
        line = _one(after, label=label)
        was, now = line["unpinned"], line["pinned"]
        return (
            f"{median(was['calls']):.3f} → {median(now['calls']):.3f} s (medians of {len(was['calls'])} calls each; "
            f"beyond the phases {median(was['outside_phases_s']) * 1e3:.1f} → "
            f"{median(now['outside_phases_s']) * 1e3:.1f} ms)"
        )

    def queue() -> str:
        q = _group_queue(after)
        bare = median(_one(after, label="sdxl-1gpu-pair-levers-pinned")["calls"])
        return (
            f"{q['job_s_median']:.3f} s a job against the bare call's {bare:.3f} s "
            f"(+{(q['job_s_median'] - bare) * 1e3:.1f} ms, {q['job_s_median'] / bare - 1:.1%}); beyond the phases "
            f"{q['overhead_s_median'] * 1e3:.1f} ms"
        ).replace("%", " %")

    def queue_before() -> str:
        runs = [x["overhead_s_median"] * 1e3 for x in _lines(before) if x.get("kind") == "group-queue"]
        return " / ".join(f"{r:.1f}" for r in runs) + " ms"

    return {
        "pinned.before.outside": outside_before,
        "pinned.before.queue": queue_before,
        "pinned.sdxl": lambda: alternated("sdxl-1gpu-pair-levers-pinned"),
        "pinned.flux": lambda: alternated("flux-1gpu-ring-levers-pinned"),
        "pinned.queue": queue,
    }


def _answer_gather() -> str:
    """The group's answer round with rank 0 holding a 1024² image, its images sent to itself
    through gloo (before 2026-11-29) and kept (since), two runs each (2 CPU ranks, this machine)."""
    runs = [x for x in _lines("cpu-answer-gather.jsonl") if x["size"] == 1024 and x["ranks"] == 2]

    def span(label: str) -> str:
        found = sorted(x["ms_median"] for x in runs if x["label"] == label)
        return f"{found[0]:.1f}-{found[-1]:.1f}" if f"{found[0]:.1f}" != f"{found[-1]:.1f}" else f"{found[0]:.1f}"

    return f"{span('sent')} → {span('kept')} ms"


def _encgraphs() -> dict[str, Callable[[], str]]:
    """``encoder-graphs`` on one H200 (``encgraphs``): the prompt's encode eager and graphed,
    alternated (bench/encode_graphs.py); one image at batch 1 with a CFG pair's levers (SDXL) and
    with the DiT's defaults (FLUX) without and with it; then (``encgraphsq``) an SDXL single
    worker through the queue with ``cuda-graphs`` without and with it, and FLUX again."""
    name, again = "h200-encgraphs-call.jsonl", "h200-encgraphsq-call.jsonl"

    def encode(model: str, batch: int, negative: bool = False) -> str:
        e = _one(name, kind="encode-graphs", model=model, batch=batch, negative=negative)
        return f"{e['eager_ms']:.1f} → {e['graphed_ms']:.1f} ms"

    def runs(file: str, prefix: str, labels: tuple[str, ...], field: str = "s_per_img", digits: int = 3) -> str:
        def value(label: str) -> float:
            run = _one(file, label=f"{prefix}-{label}")
            return run[field] if field in run else run["phases"][field]

        return " / ".join(f"{value(label) * (1e3 if digits == 0 else 1):.{digits}f}" for label in labels)

    def queue(tag: str) -> dict[str, Any]:
        return _one(again, kind="queue", tag=tag)

    def flux(field: str, digits: int, unit: str) -> str:  # once each, then without, with, without again
        first = [runs(name, "flux-1gpu", (label,), field, digits) for label in ("without", "with")]
        later = runs(again, "flux-1gpu", ("without", "with", "without-again"), field, digits)
        return f"{first[0]} → {first[1]} {unit}; again {later} {unit}"

    sdxl_without, sdxl_with = ("without", "without-again"), ("with", "with-again")
    return {
        "encgraphs.sdxl.1": lambda: encode("sdxl-random", 1),
        "encgraphs.sdxl.1neg": lambda: encode("sdxl-random", 1, negative=True),
        "encgraphs.sdxl.8": lambda: encode("sdxl-random", 8),
        "encgraphs.flux.1": lambda: encode("flux-random", 1),
        "encgraphs.flux.4": lambda: encode("flux-random", 4),
        "encgraphs.diff": lambda: f"{max(line['max_abs_diff'] for line in _lines(name) if 'max_abs_diff' in line):g}",
        "encgraphs.sdxl.image": lambda: (
            runs(name, "sdxl-1gpu", sdxl_without) + " → " + runs(name, "sdxl-1gpu", sdxl_with) + " s"
        ),
        "encgraphs.sdxl.encode": lambda: (
            runs(name, "sdxl-1gpu", sdxl_without, "encode_s", 0)
            + " → "
            + runs(name, "sdxl-1gpu", sdxl_with, "encode_s", 0)
            + " ms"
        ),
        "encgraphs.sdxl.denoise": lambda: (
            runs(name, "sdxl-1gpu", sdxl_without, "denoise_s")
            + " → "
            + runs(name, "sdxl-1gpu", sdxl_with, "denoise_s")
            + " s"
        ),
        "encgraphs.flux.image": lambda: flux("s_per_img", 3, "s"),
        "encgraphs.flux.encode": lambda: flux("encode_s", 0, "ms"),
        "encgraphs.flux.peak": lambda: "{:.2f} → {:.2f} GiB".format(
            *(_one(name, label=f"flux-1gpu-{v}")["peak_gib"] for v in ("without", "with"))
        ),
        "encgraphs.queue": lambda: "{:.4f} → {:.4f} img/s".format(
            *(queue(t)["steady_after_last_compile_img_per_s"] for t in ("sdxl-worker-graphs", "sdxl-worker-encoders"))
        ),
        "encgraphs.queue.pipeline": lambda: "{:.4f} → {:.4f} s".format(
            *(queue(t)["median_pipeline_s"] for t in ("sdxl-worker-graphs", "sdxl-worker-encoders"))
        ),
    }


def _fluxvae() -> dict[str, Callable[[], str]]:
    """FLUX on one H200 (``fluxvae``): the DiT's defaults without and with ``compile-vae``,
    alternated at 1024², once each at 2048²; then a single worker through the queue without it
    and with ``auto`` (``fluxvaeq``)."""
    name = "h200-fluxvae-call.jsonl"

    def run(label: str) -> dict[str, Any]:
        return _one(name, label=label)

    def phases(size: int) -> str:  # its decode timed apart since (fluxphases)
        p = _one("h200-fluxphases-call.jsonl", label=f"flux-{size}-1gpu-phases")["phases"]
        return f"{p['encode_s']:.3f} / {p['denoise_s']:.3f} / {p['decode_s']:.3f} s"

    def queue(tag: str) -> dict[str, Any]:  # the worker through the queue, the next call (fluxvaeq)
        return _one("h200-fluxvaeq-call.jsonl", kind="queue", tag=tag)

    def pair(size: str, field: str, unit: str, digits: int) -> str:
        a, b = (run(f"flux-{size}1gpu-{v}")[field] for v in ("without", "with"))
        return f"{a:.{digits}f} → {b:.{digits}f} {unit}"

    return {
        "fluxvae.1024": lambda: (
            " / ".join(f"{run(f'flux-1gpu-{v}')['s_per_img']:.3f}" for v in ("without", "without-again"))
            + " → "
            + " / ".join(f"{run(f'flux-1gpu-{v}')['s_per_img']:.3f}" for v in ("with", "with-again"))
            + " s"
        ),
        "fluxvae.1024.peak": lambda: pair("", "peak_gib", "GiB", 2),
        "fluxvae.2048": lambda: pair("2048-", "s_per_img", "s", 3),
        "fluxvae.2048.peak": lambda: pair("2048-", "peak_gib", "GiB", 2),
        "fluxvae.first": lambda: pair("", "first_call_s", "s", 1),
        "fluxvae.diff": lambda: f"{run('flux-1gpu-with')['max_pixel_diff_255']}/255",
        "fluxvae.phases.1024": lambda: phases(1024),
        "fluxvae.phases.2048": lambda: phases(2048),
        "fluxvae.queue": lambda: "{:.4f} → {:.4f} img/s".format(
            *(queue(tag)["steady_after_last_compile_img_per_s"] for tag in ("flux-worker-without", "flux-worker-auto"))
        ),
        "fluxvae.queue.warm": lambda: "{:.1f} → {:.1f} s".format(
            *(queue(tag)["warm_up_s"] for tag in ("flux-worker-without", "flux-worker-auto"))
        ),
    }


def _fusedrows() -> dict[str, Callable[[], str]]:
    """``fuse-qkv`` at a CFG rank's one row and one GPU's two, under CUDA graphs, one H200
    (``fusedrows``): a 32x32-level transformer (unfused, fused, unfused again) and the whole UNet."""
    name = "h200-fusedrows-call.jsonl"

    def steps(part: str, rows: int) -> list[float]:
        return [x["step_ms"] for x in _lines(name) if x.get("kind") == "unet" and x["part"] == part
                and x["unet_batch"] == rows]  # fmt: skip

    def block(rows: int) -> str:
        a, fused, again = steps("down2", rows)
        return f"{a:.2f} / {again:.2f} → {fused:.2f} ms"

    return {
        "fusedrows.block.1": lambda: block(1),
        "fusedrows.block.2": lambda: block(2),
        "fusedrows.unet.1": lambda: "{:.2f} → {:.2f} ms".format(*steps("unet", 1)),
    }


def _gemms() -> dict[str, Callable[[], str]]:
    """FLUX's products at one GPU's rows and a ring rank's, on one H200 (``fluxgemms``, then
    ``fluxfuse`` and ``fluxfuse2`` on other H200s): cuBLAS by shape, both kinds of block compiled
    with and without Inductor's GEMM tuning and with ``fuse-qkv``, and whole images with it."""
    tune, fuse, fuse2 = "h200-fluxgemms-call.jsonl", "h200-fluxfuse-gemms.jsonl", "h200-fluxfuse2-gemms.jsonl"

    def over(layout: str) -> str:
        line = _one(fuse, part="shapes", layout=layout)
        return f"{line['over_half_s']:.3f} s ({line['over_half_pct']:.1f} %)"

    def blocks(name: str, mode: str, tokens: str) -> float:
        return _one(name, part="blocks", mode=mode, tokens=tokens)["s_per_img"]

    def moved(mode: str, tokens: str) -> str:
        return f"{blocks(tune, 'compile', tokens):.3f} → {blocks(tune, mode, tokens):.3f} s"

    def first(mode: str) -> str:
        found = [x["first_call_s"] for x in _lines(tune) if x.get("part") == "block" and x.get("mode") == mode]
        return f"{min(found):.0f}-{max(found):.0f} s"

    def alternated(mode: str, tokens: str) -> str:
        found = [x["s_per_img"] for x in _lines(fuse2) if x.get("part") == "blocks" and x.get("mode") == mode
                 and x.get("tokens") == tokens]  # fmt: skip
        return " / ".join(f"{x:.3f}" for x in found) + " s"

    def image(name: str, label: str) -> str:
        runs = [_one(name, label=x, kind="group-bare")["s_per_img"] for x in (label, f"{label}-again")]
        return " / ".join(f"{x:.3f}" for x in runs) + " s"

    def peak(label: str) -> str:
        return f"{_one('h200-fluxfuse-call.jsonl', label=label, kind='group-bare')['peak_gib']:.2f} GiB"

    return {
        "gemms.cublas.over": lambda: "{over_half_s:.3f} s ({over_half_pct:.1f} %)".format(**_one(tune, part="shapes")),
        "gemms.cublas.separate": lambda: over("separate"),
        "gemms.cublas.fused": lambda: over("fused"),
        "gemms.cublas.fused-mlp": lambda: over("fused-mlp"),
        "gemms.tune.half": lambda: moved("gemmtune", "half"),
        "gemms.tune.all": lambda: moved("gemmtune", "all"),
        "gemms.tma.half": lambda: moved("gemmtune-tma", "half"),
        "gemms.tma.all": lambda: moved("gemmtune-tma", "all"),
        "gemms.tune.first": lambda: first("gemmtune"),
        "fuse.blocks.half.separate": lambda: alternated("compile", "half"),
        "fuse.blocks.half.fused": lambda: alternated("compile+fused", "half"),
        "fuse.blocks.all.separate": lambda: alternated("compile", "all"),
        "fuse.blocks.all.fused": lambda: alternated("compile+fused", "all"),
        "fuse.720.separate": lambda: image("h200-fluxfuse2-call.jsonl", "flux720-1gpu-separate"),
        "fuse.720.fused": lambda: image("h200-fluxfuse2-call.jsonl", "flux720-1gpu-fuseqkv"),
        "fuse.1gpu.separate": lambda: image("h200-fluxfuse-call.jsonl", "flux-1gpu-separate"),
        "fuse.1gpu.fused": lambda: image("h200-fluxfuse-call.jsonl", "flux-1gpu-fuseqkv"),
        "fuse.peak": lambda: f"{peak('flux-1gpu-separate')} → {peak('flux-1gpu-fuseqkv')}",
    }


def _exitq(model: str, field: str) -> str:
    """A group through the queue after its ranks leave by ``os._exit`` (``exitq``, 2 H200s)."""
    line = _one("h200x2-exitq-call.jsonl", kind="group-queue", model=model)
    if line["rc"] != 0:
        raise LookupError(f"h200x2-exitq-call.jsonl: {model}'s group exited {line['rc']}")
    if field == "exit_after_last_s":
        return f"{line[field]:.1f} s"
    if field == "overhead":
        return f"{line['overhead_s_median'] / line['job_s_median']:.1%}".replace("%", " %")
    return f"{line[field]:.3f} s"


def _rank_kind(name: str, label: str, kind: str) -> str:
    """One kind's kernel seconds an image, the ranks' mean."""
    ranks = _one(name, label=label, kind="group-profile")["ranks"]
    return f"{sum(r['kernel_s_by_kind'][kind] for r in ranks) / len(ranks):.2f} s"


def _a2a(field: str) -> str:
    """One FLUX Ulysses 2 all-to-all timed alone, NCCL's defaults (``h100x2-fluxcp-call.jsonl``)."""
    return f"{_one('h100x2-fluxcp-call.jsonl', kind='a2a', label='default', rank=0)[field]:g}"


def _rows(name: str, config: str, whole: int, half: int) -> str:
    """What halving the UNet's rows saves on one GPU: the most a CFG pair can gain on the UNet."""
    step = {line["unet_batch"]: line["step_ms"] for line in _lines(name) if line.get("config") == config}
    return f"{step[whole] / step[half]:.2f}×"


def _tuned(rows: int, shape: str | None = None) -> str:
    """Inductor's GEMM tuning at ``rows`` UNet rows (``h100x2-rowtune-autotune.jsonl``): how much
    faster its pick is than cuBLAS on ``shape``, or on how many of the distinct shapes it beat cuBLAS."""
    picks = [p for p in _lines("h100x2-rowtune-autotune.jsonl") if p["rows"] == rows]
    if shape is not None:
        pick = next(p for p in picks if p["shape"] == shape)
        return f"{pick['cublas_ms'] / pick['best_ms']:.2f}×"
    first = {(p["op"], p["shape"]): p for p in reversed(picks)}
    won = sum(p["best"].startswith("triton") for p in first.values())
    return f"{won} of {len(first)}"


def _block(rows: int) -> str:
    """One 32x32-level transformer under CUDA graphs, without and with the tuned GEMMs (``h100x2-blocktune-call``)."""
    step = {
        line["config"]: line["step_ms"]
        for line in _lines("h100x2-blocktune-call.jsonl")
        if line.get("kind") == "unet" and line["unet_batch"] == rows
    }
    return f"{step['cudagraphs-fp16']:.2f} → {step['gemmtune-fp16']:.2f} ms"


#: every figure a page may name, computed from bench/results
FIGURES: dict[str, Callable[[], str]] = {
    **_fp8("h100"),
    **_fp8("h200"),
    **_pair("fp8.h100.chunk16", "h100-fp8-chunk16.jsonl", "fp16-chunk16", "fp8-chunk16"),
    **_pair("fp8.flux", "h100-flux-fp8-call.jsonl", "flux-fp16", "flux-fp8", base_word="bf16"),
    "fp8.flux.psnr": lambda: f"{_one('h100-flux-fp8-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    # --precision fp8 with its 3x3 convolutions in FP8 too (the Triton kernel, 2026-11-26)
    **_pair("fp8conv.h100", "h100-fp8conv-queue-call2.jsonl", "fp16", "fp8"),
    "fp8conv.h100.psnr": lambda: f"{_one('h100-fp8conv-queue-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "fp8conv.unet.gain": lambda: _unet_gain("h100-fp8conv-profile-call2.jsonl", "tensor-linears", "tensor"),
    "first-image.warm.fp8conv": lambda: _first_image("h100-fp8conv-queue-call2.jsonl", "fp8"),
    "first-image.cold.fp8conv": lambda: _first_image("h100-fp8conv-cold-call.jsonl", "fp8"),
    # the linears' GEMMs with fast accumulation (K <= 5120), batch 8 and 16 (2026-11-26, fifth session)
    **_pair("fp8fast.h100", "h100-fastacc-queue-call2.jsonl", "fp16", "fp8"),
    "fp8fast.h100.psnr": lambda: f"{_one('h100-fastacc-queue-call2.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    **_pair("fp8fast.h100.chunk16", "h100-fastacc16-queue-call.jsonl", "fp16", "fp8"),
    "fp8fast.unet.gain": lambda: _unet_gain("h100-fastacc-call.jsonl", "tensor", "tensor-fastacc"),
    "fp8mk.unet.gain": lambda: _unet_gain("h100-inductor-call1.jsonl", "tensor", "tensor@mk"),
    "first-image.warm.fp8fast": lambda: _first_image("h100-fastacc-queue-call2.jsonl", "fp8"),
    # GEGLU's input written in FP8; the FP8 attention kernel (2026-11-26, sixth session)
    **_pair("act8.h100", "h100-act8-queue-call.jsonl", "fp16", "fp8"),
    "act8.h100.psnr": lambda: f"{_one('h100-act8-queue-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "act8.unet.gain": lambda: _unet_gain("h100-act8-call.jsonl", "tensor", "tensor-act8"),
    **_pair("act8.h100.chunk16", "h100-act8-16-queue-call.jsonl", "fp16", "fp8"),
    "first-image.warm.act8.chunk16": lambda: _first_image("h100-act8-16-queue-call.jsonl", "fp8"),
    # GEGLU's GELU in its tanh form; persistent LayerNorms (2026-11-27, seventh session)
    "gelu.unet.gain": lambda: _unet_gain("h100-gelu-call.jsonl", "tensor-erf", "tensor-tanh"),
    **_pair("gelu.h100.chunk16", "h100-gelu-queue-call.jsonl", "fp16", "fp8"),
    "gelu.h100.psnr": lambda: f"{_one('h100-gelu-queue-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "first-image.warm.gelu.chunk16": lambda: _first_image("h100-gelu-queue-call.jsonl", "fp8"),
    "persist.unet.gain": lambda: _unet_gain("h100-persist-call.jsonl", "tensor", "tensor@persist"),
    "persist.unet.fp16.gain": lambda: _unet_gain("h100-persist-fp16-call.jsonl", "fp16", "fp16@persist"),
    # persistent LayerNorms through the queue; batch 32 (2026-11-27, eighth session)
    **_pair("persistq.h100.chunk16", "h100-persistq-queue-call.jsonl", "fp16", "fp8"),
    "persistq.h100.psnr": lambda: f"{_one('h100-persistq-queue-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "first-image.warm.persistq.chunk16": lambda: _first_image("h100-persistq-queue-call.jsonl", "fp8"),
    "batch32.h100.fp8": lambda: f"{_rate('h100-batch32-call.jsonl', 'fp8'):.3f}",
    # empty-negative: the empty negative prompt's rows skip cross-attention (2026-11-27, tenth session)
    "empty.unet.gain": lambda: _unet_gain("h100-empty-call.jsonl", "tensor@persist", "tensor@persist+empty"),
    "empty.unet.fp16.gain": lambda: _unet_gain("h100-empty-call.jsonl", "fp16", "fp16@empty"),
    **_pair("empty.h100.chunk16", "h100-empty-queue-call.jsonl", "fp16", "fp8"),
    "empty.h100.chunk16.fp8.again": lambda: f"{_rate('h100-empty-queue2-call.jsonl', 'fp8'):.3f}",
    "empty.h100.psnr": lambda: f"{_one('h100-empty-queue-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "first-image.warm.empty.chunk16": lambda: _first_image("h100-empty-queue-call.jsonl", "fp8"),
    "empty.h100.fp16.without": lambda: f"{_rate('h100-empty-fp16-call.jsonl', 'fp16'):.3f}",
    "empty.h100.fp16.with": lambda: f"{_rate('h100-empty-fp16-call.jsonl', 'fp16en'):.3f}",
    "empty.h100.fp16.gain": lambda: (
        f"{_rate('h100-empty-fp16-call.jsonl', 'fp16en') / _rate('h100-empty-fp16-call.jsonl', 'fp16'):.2f}×"
    ),
    **_pair("empty.h200.chunk16", "h200-empty-call.jsonl", "fp16", "fp8"),
    "empty.fp16.psnr": lambda: f"{_one('h100-empty-fp16-call.jsonl', kind='quality')['psnr_mean_db']:.1f} dB",
    "first-image.cold.batch32": lambda: _first_image("h100-batch32-call.jsonl", "fp8"),
    "decoder.fp8conv.speedup": lambda: (
        f"{_one('h100-decoder-convs-call.jsonl', label='fp8conv.decoder_call')['speedup_kernels']:.2f}×"
    ),
    "decoder.h100.b16": lambda: f"{_one('h100-decoder-profile-call.jsonl', kind='decoder_time')['decode_ms']:.0f} ms",
    "fp8attn.speedup": lambda: f"{_one('h100-fp8attn-call.jsonl', label='fp8attn.unet_call')['speedup_kernels']:.2f}×",
    "defaults.h100": lambda: _defaults("h100"),
    "defaults.h200": lambda: _defaults("h200"),
    "queue.share": _queue_share,
    "enqueue.rate": _enqueue_rate,
    "demo.seconds": _demo,
    "first-image.cold.fp16": lambda: _cold_first_image("fp16"),
    "first-image.cold.fp8": lambda: _cold_first_image("fp8"),
    "first-image.warm": lambda: _first_image("h100-precompile-call.jsonl", "preBwarm"),
    "first-image.new-host": lambda: _first_image("h100-precompile-call.jsonl", "preB"),
    "first-image.warm.fp8": lambda: _first_image("h100-fp8-call2.jsonl", "adapters-fp8"),
    "scaling.2": lambda: _scaling(2),
    "scaling.4": lambda: _scaling(4),
    "scaling.vae-fp16.2": lambda: _scaling(2, "h200x4-queue.jsonl"),
    "scaling.vae-fp16.4": lambda: _scaling(4, "h200x4-queue.jsonl"),
    "group.sdxl.cfg2": lambda: _group("h100x2-cudagraphs1-call.jsonl", "sdxl-1gpu-cudagraphs", "sdxl-cfg2-cudagraphs"),
    "group.sdxl.cfg2.b4": lambda: _group("h100x2-sdxl4-call.jsonl", "sdxl-1gpu-b4", "sdxl-cfg2-b4"),
    "group.sdxl.cfg2.b4.queue": lambda: (
        f"{_one('h100x2-sdxl4-queue-call.jsonl', kind='group-queue')['steady_s_per_job']:.3f} s"
    ),
    # the cuda-graphs lever (worker/pipelines/step_graphs.py), 2 H100s, batch 1 and 4, one call each
    "graphs.1gpu": lambda: _group("h100x2-graphs2-call.jsonl", "sdxl-1gpu-worker-levers", "sdxl-1gpu-cuda-graphs"),
    "graphs.cfg2.vs-worker": lambda: _group(
        "h100x2-graphs2-call.jsonl", "sdxl-1gpu-worker-levers", "sdxl-cfg2-group-default"
    ),
    "graphs.cfg2": lambda: _group("h100x2-graphs2-call.jsonl", "sdxl-1gpu-cuda-graphs", "sdxl-cfg2-group-default"),
    "graphs.cfg2.s": lambda: f"{_one('h100x2-graphs2-call.jsonl', label='sdxl-cfg2-group-default')['s_per_img']:.3f} s",
    "graphs.cfg2.queue": lambda: f"{_one('h100x2-graphs2-call.jsonl', kind='group-queue')['job_s_median']:.3f} s",
    "graphs.cfg2.b4": lambda: _group(
        "h100x2-graphs4-call.jsonl", "sdxl-1gpu-b4-cuda-graphs", "sdxl-cfg2-b4-group-default"
    ),
    "graphs.cfg2.b4.vs-worker": lambda: _group(
        "h100x2-graphs4-call.jsonl", "sdxl-1gpu-b4", "sdxl-cfg2-b4-group-default"
    ),
    "graphs.worker.chunk2": lambda: (
        f"{_one('h100-worker-graphs-call.jsonl', kind='queue')['steady_img_per_s']:.3f} img/s"
    ),
    "unet.rows.1-2": lambda: _rows("h100-unet-rows-call1.jsonl", "cudagraphs-fp16", 2, 1),
    "unet.rows.4-8": lambda: _rows("h100-unet-rows-call2.jsonl", "compile-fp16", 8, 4),
    "rowtune.rows.1-2": lambda: _rows("h100x2-rowtune-call1.jsonl", "cudagraphs-fp16", 2, 1),
    "rowtune.ffout.1": lambda: _tuned(1, "1024x1280, 1024x5120, 5120x1280"),
    "rowtune.ffout.2": lambda: _tuned(2, "2048x1280, 2048x5120, 5120x1280"),
    "rowtune.won.1": lambda: _tuned(1),
    "rowtune.won.2": lambda: _tuned(2),
    "blocktune.1": lambda: _block(1),
    "blocktune.2": lambda: _block(2),
    "blocktune.rows.1-2": lambda: _rows("h100x2-blocktune-call.jsonl", "cudagraphs-fp16", 2, 1),
    "group.engine.1gpu": lambda: f"{_one('h100-group-engine-call.jsonl', kind='group-bare')['s_per_img']:.3f} s",
    "worker.run-batch.defaults": lambda: (
        f"{_one('h100-group-engine-call.jsonl', kind='pipeline', label='+compile-vae')['s_per_img']:.3f} s"
    ),
    "group.flux.u2": lambda: _group("h200x2-compile-call.jsonl", "flux-1gpu-compiled", "flux-u2-compiled"),
    "group.flux.u4": lambda: _group("h200x4-flux4c-call.jsonl", "flux-1gpu-compiled", "flux-u4-compiled"),
    "group.flux.u2.h100": lambda: _group("h100x2-flux1024-call.jsonl", "flux-1gpu-compiled", "flux-u2-compiled"),
    "group.flux2048.u2": lambda: _group("h100x2-flux2048-call.jsonl", "flux-2048-1gpu", "flux-2048-u2"),
    "group.flux2048.u2.product": lambda: _group(
        "h100x2-flux2048g-call.jsonl", "flux-2048-1gpu", "flux-2048-u2-product"
    ),
    "group.flux2048.u2.pvae": lambda: _group("h100x2-flux2048-call.jsonl", "flux-2048-1gpu", "flux-2048-u2-pvae"),
    "fleet.latency.wait": lambda: f"{_one('h100x4-fleet-call2.jsonl')['latency_wait_s_median'] * 1000:.0f} ms",
    "fleet.latency.run": lambda: f"{_one('h100x4-fleet-call2.jsonl')['latency_run_s_median']:.2f} s",
    "fleet.bulk": lambda: f"{_one('h100x4-fleet-call2.jsonl')['img_per_s_after_warm']:.2f} img/s",
    "split.fluxsplit.queue": lambda: (
        f"{_one('h100x2-fluxsplit-call.jsonl', kind='group-queue')['queue_overhead_frac']:.1%}".replace("%", " %")
    ),
    "split.fluxgraphs.queue": lambda: (
        f"{_one('h100x2-fluxgraphs-call.jsonl', kind='group-queue')['queue_overhead_frac']:.1%}".replace("%", " %")
    ),
    "split.fluxgraphs.queue.job": lambda: (
        f"{_one('h100x2-fluxgraphs-call.jsonl', kind='group-queue')['job_s_median']:.3f} s"
    ),
    **_flux4g(),
    "graphs.flux.u2": lambda: "{:.2f} → {:.2f} s".format(
        *(_one("h100x2-fluxgraphs-call.jsonl", label=f"flux-u2-{r}")["s_per_img"] for r in ("nographs", "product"))
    ),
    "split.fluxringq.queue": lambda: (
        f"{_one('h100x2-fluxringq-call.jsonl', kind='group-queue')['queue_overhead_frac']:.1%}".replace("%", " %")
    ),
    "split.fluxringq.queue.job": lambda: (
        f"{_one('h100x2-fluxringq-call.jsonl', kind='group-queue')['job_s_median']:.3f} s"
    ),
    "split.fluxringq.exit": lambda: (
        f"{_one('h100x2-fluxringq-call.jsonl', kind='group-queue')['exit_after_last_s']:.1f} s"
    ),
    **_queued("fluxring4"),
    "group.flux2048.r2.own": lambda: _group("h100x2-fluxring5-call.jsonl", "flux-2048-1gpu", "flux-2048-r2-own"),
    "prof.ring.diffusers.elementwise": lambda: _kernels("fluxring3", "flux-r2-product", "elementwise"),
    "prof.ring.own.elementwise": lambda: _kernels("fluxring4", "flux-r2-own", "elementwise"),
    "prof.ring.1gpu.elementwise": lambda: _kernels("fluxring3", "flux-1gpu-compiled", "elementwise"),
    "prof.ring.own.compute": lambda: _rank_mean("fluxring4", "flux-r2-own", "compute_s"),
    "prof.ring.1gpu.compute": lambda: _rank_mean("fluxring3", "flux-1gpu-compiled", "compute_s"),
    "prof.ring.own.exposed": lambda: _rank_mean("fluxring4", "flux-r2-own", "collectives_exposed_s"),
    "prof.ring.diffusers.exposed": lambda: _rank_mean("fluxring3", "flux-r2-product", "collectives_exposed_s"),
    "prof.ring.own.gemm": lambda: _kernels("fluxring4", "flux-r2-own", "gemm"),
    "prof.ring.1gpu.gemm": lambda: _kernels("fluxring3", "flux-1gpu-compiled", "gemm"),
    "prof.ring.own.attention": lambda: _kernels("fluxring4", "flux-r2-own", "attention"),
    "prof.ring.1gpu.attention": lambda: _kernels("fluxring3", "flux-1gpu-compiled", "attention"),
    "prof.ring.own.unsplit": lambda: "{:.2f} s".format(
        sum(
            sum(r[f] for r in _one("h100x2-fluxring4-call.jsonl", label="flux-r2-own", kind="group-profile")["ranks"])
            / 2
            for f in ("encode_prompt_s", "decode_s")
        )
    ),
    **{
        f"contention.{name}.{what}": (
            lambda label=label, what=what: "{:.2f} s".format(
                sum(
                    (r["kernel_s_by_kind"][what] if what in r["kernel_s_by_kind"] else r[what])
                    for r in _one("h200x2-fluxring6-call.jsonl", label=label, kind="group-profile")["ranks"]
                )
                / 2
            )
        )
        for name, label in (("overlapped", "flux-r2-own"), ("alone", "flux-r2-own-nooverlap"))
        for what in ("gemm", "compute_s", "collectives_exposed_s")
    },
    "contention.s": lambda: "{:.3f} s against {:.3f} s".format(
        *(
            _one("h200x2-fluxring6-call.jsonl", label=x, kind="group-bare")["s_per_img"]
            for x in ("flux-r2-own", "flux-r2-own-nooverlap")
        )
    ),
    **_pull(),
    **_where(),
    **_modulation(),
    **_modring(),
    **_merge(),
    **_gemms(),
    **_pairparts(),
    **_fusedrows(),
    **_decodemem(),
    **_fluxvae(),
    **_encgraphs(),
    **_ringcalls(),
    **_done2(),
    **_pinned(),
    **_done2q(),
    **_rounding2(),
    **_fusering(),
    **{
        f"exitq.{short}.{name}": (lambda m=model, f=field: _exitq(m, f))
        for short, model in (("flux", "flux-random"), ("sdxl", "sdxl-random"))
        for name, field in (("job", "job_s_median"), ("exit", "exit_after_last_s"), ("overhead", "overhead"))
    },
    "flux4own.r4": lambda: _group("h100x4-flux4own-call.jsonl", "flux-1gpu-compiled", "flux-r4-own"),
    "flux4own.r4.diffusers": lambda: _group("h100x4-flux4own-call.jsonl", "flux-1gpu-compiled", "flux-r4-diffusers"),
    "flux4r.r4": lambda: _group("h100x4-flux4r-call.jsonl", "flux-1gpu-compiled", "flux-r4-product"),
    "flux4r.u4": lambda: _group("h100x4-flux4r-call.jsonl", "flux-1gpu-compiled", "flux-u4-product"),
    "group.flux2048.r2.product": lambda: _group(
        "h100x2-flux2048r-call.jsonl", "flux-2048-1gpu", "flux-2048-r2-product"
    ),
    "group.flux2048.u2.product2": lambda: _group(
        "h100x2-flux2048r-call.jsonl", "flux-2048-1gpu", "flux-2048-u2-product"
    ),
    "split.fluxgraphs.exit": lambda: (
        f"{_one('h100x2-fluxgraphs-call.jsonl', kind='group-queue')['exit_after_last_s']:.1f} s"
    ),
    "prof.xdit.a2a": lambda: _least_a2a("fluxprofile", "flux-u2-compiled"),
    "prof.diffusers.a2a": lambda: _least_a2a("fluxcp", "flux-u2-diffusers-cp"),
    "prof.xdit.elementwise": lambda: _kernels("fluxprofile", "flux-u2-compiled", "elementwise"),
    "prof.diffusers.elementwise": lambda: _kernels("fluxcp", "flux-u2-diffusers-cp", "elementwise"),
    "prof.xdit.gemm": lambda: _kernels("fluxprofile", "flux-u2-compiled", "gemm"),
    "prof.diffusers.gemm": lambda: _kernels("fluxcp", "flux-u2-diffusers-cp", "gemm"),
    "a2a.us": lambda: _a2a("us_per_exchange"),
    "a2a.gbps": lambda: _a2a("gb_per_s"),
    **_split_calls(),
    "group.flux.u4.queue": lambda: (
        f"{_one('h200x4-flux4c-call.jsonl', kind='group-queue')['queue_overhead_frac']:.1%}".replace("%", " %")
    ),
}


def problems(pages: list[Path] = PAGES) -> list[str]:
    out = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name, text in FIGURE.findall(line):
                where = f"{page.relative_to(ROOT)}:{number}"
                if name not in FIGURES:
                    out.append(f"{where}: no figure named {name} in bench/figures.py")
                elif text != (value := FIGURES[name]()):
                    out.append(f"{where}: {name} says {text!r}, bench/results gives {value!r} (make docs)")
    return out


def write(pages: list[Path] = PAGES) -> int:
    """Every figure of ``pages`` rewritten from the results; returns how many changed."""
    changed = 0

    def fill(match: re.Match[str]) -> str:
        nonlocal changed
        value = FIGURES[match[1]]()
        changed += value != match[2]
        return f"<!-- fig {match[1]} -->{value}<!-- /fig -->"

    for page in pages:
        text = page.read_text(encoding="utf-8")
        new = FIGURE.sub(fill, text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on a figure that differs from bench/results")
    parser.add_argument("--write", action="store_true", help="rewrite every figure from bench/results")
    args = parser.parse_args()
    if args.write:
        print(f"figures: {write()} rewritten from bench/results")
    found = problems()
    for problem in found:
        print(problem)
    if not found:
        print(f"figures: every figure in {len(PAGES)} pages matches bench/results")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
