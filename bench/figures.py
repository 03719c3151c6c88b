"""Measured figures in README and docs, from one source: the raw lines in ``bench/results/``.

A page writes a figure as ``<!-- fig NAME -->TEXT<!-- /fig -->`` (the comments do not render);
TEXT is what the row NAME of :data:`FIGURES` gives from the results files (:func:`pick`: a
field of the one line whose fields equal the match). ``make docs`` rewrites every figure from
the files; ``make lint`` runs ``--check``, which prints ``FILE:LINE: NAME says TEXT,
bench/results gives VALUE`` for each figure that drifted, names an unknown figure or a row no
page shows, and exits 1. A new measurement is a new results file and a new row here, never a
number typed into a page.

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
def lines(name: str) -> tuple[dict[str, Any], ...]:
    text = (RESULTS / f"{name}.jsonl").read_text()
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def pick(file: str, field: str, each: bool = False, **match: Any) -> Any:
    """``field`` (``a.b`` reaches into a nested object) of the one line of ``results/FILE.jsonl``
    whose fields equal ``match``; with ``each``, of every such line (a list)."""
    found = [x for x in lines(file) if all(x.get(k) == v for k, v in match.items())]
    if not found or (len(found) > 1 and not each):
        raise LookupError(f"{file}.jsonl: {len(found)} lines match {match}, not 1")
    values = []
    for line in found:
        for part in field.split("."):
            line = line[part]
        values.append(line)
    return values if each else values[0]


def span(template: str, *values: Any) -> str:
    """``lo–hi`` of the numbers given (a list counts as its items)."""
    flat = [v for x in values for v in (x if isinstance(x, list) else [x])]
    return f"{template}–{template}".format(min(flat), max(flat))


# the shapes most rows take
def rate(file: str, tag: str) -> float:
    """A run through the queue (bench/e2e_queue.py): steady images a second after the first job."""
    return pick(file, "steady_img_per_s", kind="queue", tag=tag)


def first_image(file: str, tag: str) -> str:
    return f"{pick(file, 'launch_to_first_image_s', kind='queue', tag=tag):.1f} s"


def arrow(file: str, before: str, after: str) -> str:
    """Seconds an image, one label's against another's in the same call, and the gain."""
    a, b = pick(file, "s_per_img", label=before), pick(file, "s_per_img", label=after)
    return f"{a:.3f} → {b:.3f} s ({a / b:.2f}×)"


def times(file: str, one: str, many: str) -> str:
    """A group's image against one GPU's, bare, in the same call."""
    return f"{pick(file, 's_per_img', label=one) / pick(file, 's_per_img', label=many):.2f}×"


def against_one(file: str, label: str, one: str = "flux-1gpu-compiled") -> str:
    """A group's seconds an image and its speedup over the call's one GPU (bare lines)."""
    many, alone = (pick(file, "s_per_img", kind="group-bare", label=x) for x in (label, one))
    return f"{many:.3f} s ({alone / many:.2f}×)"


def queued(file: str, field: str = "queue_overhead_frac", template: str = "{:.1f} %") -> str:
    """A group through the queue (bench/group_queue.py): the queue's share, or another field."""
    value = pick(file, field, kind="group-queue")
    return template.format(value * 100 if template.endswith("%") else value)


def rated(file: str, tag: str) -> Callable[[], str]:
    """A row showing one run's steady rate (bench/e2e_queue.py), to three places."""
    return lambda: f"{rate(file, tag):.3f}"


def scaling(file: str, n: int) -> Callable[[], str]:
    return lambda: f"{pick(file, 'steady_img_per_s', gpus=n) / pick(file, 'steady_img_per_s', gpus=1):.2f}×"


def fp8_calls(prefix: str, file: str, base: str = "fp16", fp8: str = "fp8", word: str = "fp16") -> dict[str, Any]:
    """A call's baseline rate and its fp8 rate, as ``PREFIX.<word>`` and ``PREFIX.fp8``."""
    return {f"{prefix}.{word}": rated(file, base), f"{prefix}.fp8": rated(file, fp8)}


def psnr(file: str) -> Callable[[], str]:
    return lambda: f"{pick(file, 'psnr_mean_db', kind='quality'):.1f} dB"


def cold(precision: str) -> list[float]:
    """A worker's first image on a cold machine, the newest calls with the overlapped writer."""
    return [
        x
        for f in ("h100-fp8-call1", "h200-fp8-call1", "h100-fp8-chunk16")
        for x in pick(f, "launch_to_first_image_s", True, kind="queue", precision=[precision])
    ]


def rounded(label: str) -> str:
    """A FLUX image rounded on the host (diffusers' PIL output) against on the device: medians."""
    kinds = ("host_rounding", "device_rounding")
    calls = [statistics.median(pick(ROUND, f"{k}.calls", label=label)) for k in kinds]
    decodes = [statistics.median(pick(ROUND, f"{k}.decode_s", label=label)) * 1e3 for k in kinds]
    return "{:.3f} → {:.3f} s (decode {:.0f} → {:.0f} ms)".format(*calls, *decodes)


QUEUE_CALLS = ("h100-fp8-call1", "h200-fp8-call1", "h100-fp8-chunk16")
#: the fp16 defaults through the queue, every call that ran them, by GPU
DEFAULTS = {
    "h100": [("h100-defaults-call", "defaults"), ("h100-rq3-call", "defaults"),
             ("h100-adapters-direct-call", "defaults"), ("h100-fp8-call1", "fp16")],
    "h200": [("h200-defaults-call", "defaults"), ("h200-adapters-call", "defaults"), ("h200-fp8-call1", "fp16")],
}  # fmt: skip
G4, Q2, DEC, FUSE = "h100x4-flux4g-call", "h200x2-done2q-call", "h200x2-fluxdecode-call", "h200x2-fusering2-call"
ROUND, FLEET, VAE = "h200x2-rounding2-call", "h100x4-fleet-call2", "h200-fluxvae-call"
ENQUEUE = {"event": "enqueue alone, new rows (check pass included)"}


def done2q_queue() -> str:
    """An SDXL CFG pair's job through the queue against the bare call (issue 46's done means)."""
    job, bare = pick(Q2, "job_s_median", kind="group-queue"), statistics.median(pick(Q2, "calls", label="sdxl-cfg2"))
    gap = statistics.median(pick(Q2, "gap_between_jobs_s", kind="group-queue"))
    return (
        f"{job:.3f} s a job against the bare call's {bare:.3f} s (medians; +{(job / bare - 1) * 100:.1f} %, with the "
        f"gap to the next job +{((job + gap) / bare - 1) * 100:.1f} %); beyond the slowest rank's phases "
        f"{pick(Q2, 'overhead_s_median', kind='group-queue') * 1e3:.1f} ms; "
        f"{pick(Q2, 'queue_overhead_frac', kind='group-queue') * 100:.1f} % over the run of "
        f"{pick(Q2, 'jobs', kind='group-queue')} jobs"
    )


def split_decode() -> str:
    ds = [pick(DEC, "s_per_img", kind="group-bare", label=f"flux-r2-splitdecode{x}") for x in ("", "-again")]
    one = pick(DEC, "s_per_img", kind="group-bare", label="flux-1gpu-compiled")
    return "{:.3f} / {:.3f} s ({:.2f}× / {:.2f}×)".format(*ds, *(one / d for d in ds))


def fused_ring() -> str:
    one = pick(FUSE, "s_per_img", label="flux-1gpu-compiled")
    ring = min(pick(FUSE, "s_per_img", label=f"flux-r2-fuseqkv{x}") for x in ("", "-warm", "-warm2"))
    return f"{one:.3f} → {ring:.3f} s ({one / ring:.2f}×)"


FIGURES: dict[str, Callable[[], str]] = {
    # one GPU through the queue: defaults, fp8 and its variants (docs/benchmarks.md)
    **fp8_calls("fp8.h100", "h100-fp8-call1"),
    **fp8_calls("fp8.h200", "h200-fp8-call1"),
    "fp8.h100.psnr": psnr("h100-fp8-call1"),
    "fp8.h200.psnr": psnr("h200-fp8-call1"),
    **fp8_calls("fp8.h100.chunk16", "h100-fp8-chunk16", "fp16-chunk16", "fp8-chunk16"),
    **fp8_calls("fp8.flux", "h100-flux-fp8-call", "flux-fp16", "flux-fp8", word="bf16"),
    "fp8.flux.gain": lambda: f"{rate('h100-flux-fp8-call', 'flux-fp8') / rate('h100-flux-fp8-call', 'flux-fp16'):.2f}×",
    "fp8.flux.psnr": psnr("h100-flux-fp8-call"),
    "fp8conv.h100.fp8": rated("h100-fp8conv-queue-call2", "fp8"),
    **fp8_calls("fp8fast.h100", "h100-fastacc-queue-call2"),
    "fp8fast.h100.psnr": psnr("h100-fastacc-queue-call2"),
    "fp8fast.h100.chunk16.fp8": rated("h100-fastacc16-queue-call", "fp8"),
    "act8.h100.chunk16.fp8": rated("h100-act8-16-queue-call", "fp8"),
    "gelu.h100.chunk16.fp8": rated("h100-gelu-queue-call", "fp8"),
    "persistq.h100.chunk16.fp8": rated("h100-persistq-queue-call", "fp8"),
    "batch32.h100.fp8": rated("h100-batch32-call", "fp8"),
    "empty.h100.chunk16.fp8": rated("h100-empty-queue-call", "fp8"),
    "empty.h100.chunk16.gain": lambda: (
        f"{rate('h100-empty-queue-call', 'fp8') / rate('h100-empty-queue-call', 'fp16'):.2f}×"
    ),
    "empty.h100.chunk16.fp8.again": rated("h100-empty-queue2-call", "fp8"),
    "empty.h100.fp16.with": rated("h100-empty-fp16-call", "fp16en"),
    "empty.h100.fp16.without": rated("h100-empty-fp16-call", "fp16"),
    "empty.h200.chunk16.fp8": rated("h200-empty-call", "fp8"),
    **{f"defaults.{gpu}": lambda gpu=gpu: span("{:.3f}", *(rate(*c) for c in DEFAULTS[gpu])) for gpu in DEFAULTS},
    "queue.share": lambda: (
        span("{:.1f}", *(x * 100 for c in QUEUE_CALLS for x in pick(c, "queue_overhead_frac", True, kind="queue")))
        + " %"
    ),
    "unet.rows.1-2": lambda: "{:.2f}×".format(
        pick("h100-unet-rows-call1", "step_ms", config="cudagraphs-fp16", unet_batch=2)
        / pick("h100-unet-rows-call1", "step_ms", config="cudagraphs-fp16", unet_batch=1)
    ),
    # a worker's first image
    **{f"first-image.cold.{p}": lambda p=p: span("{:.0f}", *cold(p)) + " s" for p in ("fp16", "fp8")},
    "first-image.cold.fp8conv": lambda: first_image("h100-fp8conv-cold-call", "fp8"),
    "first-image.new-host": lambda: first_image("h100-precompile-call", "preB"),
    "first-image.warm": lambda: first_image("h100-precompile-call", "preBwarm"),
    "first-image.warm.fp8": lambda: first_image("h100-fp8-call2", "adapters-fp8"),
    "first-image.warm.fp8conv": lambda: first_image("h100-fp8conv-queue-call2", "fp8"),
    # CPU: make demo, enqueue, a fleet of four through one Redis
    "demo.seconds": lambda: span("{:.0f}", *pick("demo-cpu", "seconds", True, rc=0, images=13)) + " s",
    "enqueue.rate": lambda: "10⁶ rows enqueue in {:.0f} s ({:,} rows/s)".format(
        *(pick("campaign-enqueue-1e6", f, **ENQUEUE) for f in ("seconds", "rows_per_s"))
    ),
    "fleet.bulk": lambda: f"{pick(FLEET, 'img_per_s_after_warm'):.2f} img/s",
    "fleet.latency.run": lambda: f"{pick(FLEET, 'latency_run_s_median'):.2f} s",
    "fleet.latency.wait": lambda: f"{pick(FLEET, 'latency_wait_s_median') * 1000:.0f} ms",
    # data parallel: N pinned workers against one (one 4-GPU machine, one call)
    **{f"scaling.{n}": scaling("h200x4-scaling-defaults", n) for n in (2, 4)},
    **{f"scaling.vae-fp16.{n}": scaling("h200x4-queue", n) for n in (2, 4)},
    # groups (docs/groups.md)
    "group.engine.1gpu": lambda: f"{pick('h100-group-engine-call', 's_per_img', kind='group-bare'):.3f} s",
    "worker.run-batch.defaults": lambda: (
        f"{pick('h100-group-engine-call', 's_per_img', kind='pipeline', label='+compile-vae'):.3f} s"
    ),
    "group.flux.u2.h100": lambda: times("h100x2-flux1024-call", "flux-1gpu-compiled", "flux-u2-compiled"),
    "group.flux.u4": lambda: times("h200x4-flux4c-call", "flux-1gpu-compiled", "flux-u4-compiled"),
    "group.flux.u4.queue": lambda: queued("h200x4-flux4c-call"),
    "group.flux2048.u2": lambda: times("h100x2-flux2048-call", "flux-2048-1gpu", "flux-2048-u2"),
    "group.flux2048.u2.pvae": lambda: times("h100x2-flux2048-call", "flux-2048-1gpu", "flux-2048-u2-pvae"),
    "group.flux2048.u2.product": lambda: times("h100x2-flux2048g-call", "flux-2048-1gpu", "flux-2048-u2-product"),
    "group.sdxl.cfg2.b4": lambda: times("h100x2-sdxl4-call", "sdxl-1gpu-b4", "sdxl-cfg2-b4"),
    "graphs.cfg2.queue": lambda: queued("h100x2-graphs2-call", "job_s_median", "{:.3f} s"),
    "flux4g.1gpu": lambda: f"{pick(G4, 's_per_img', label='flux-1gpu-compiled'):.3f} s",
    "flux4g.u4": lambda: against_one(G4, "flux-u4-product"),
    "flux4g.u4.nographs": lambda: against_one(G4, "flux-u4-nographs"),
    "flux4g.u2": lambda: against_one(G4, "flux-u2-product"),
    "flux4g.queue.job": lambda: queued(G4, "job_s_median", "{:.3f} s"),
    "flux4g.queue.per-job": lambda: "{:.1f} %".format(
        pick(G4, "overhead_s_median", kind="group-queue") / pick(G4, "job_s_median", kind="group-queue") * 100
    ),
    "flux4g.queue.run": lambda: queued(G4),
    "flux4own.r4": lambda: times("h100x4-flux4own-call", "flux-1gpu-compiled", "flux-r4-own"),
    "flux4r.r4": lambda: times("h100x4-flux4r-call", "flux-1gpu-compiled", "flux-r4-product"),
    "flux4r.u4": lambda: times("h100x4-flux4r-call", "flux-1gpu-compiled", "flux-u4-product"),
    "split.fluxgraphs.product": lambda: against_one("h100x2-fluxgraphs-call", "flux-u2-product"),
    "split.fluxgraphs.queue": lambda: queued("h100x2-fluxgraphs-call"),
    "split.fluxgraphs.queue.job": lambda: queued("h100x2-fluxgraphs-call", "job_s_median", "{:.3f} s"),
    "split.fluxring4.r2-own": lambda: against_one("h100x2-fluxring4-call", "flux-r2-own"),
    "split.fluxring4.queue": lambda: queued("h100x2-fluxring4-call"),
    "decode.split": split_decode,
    "rounding.1024.1gpu": lambda: rounded("flux-1024-1gpu-rounding"),
    "rounding.1024.ring": lambda: rounded("flux-1024-r2-rounding"),
    "fusering.2048": lambda: arrow("h200x2-fuse2048-call", "flux-2048-1gpu", "flux-2048-r2-defaults"),
    "fusering.ratio": fused_ring,
    "fluxvae.2048": lambda: "{:.3f} → {:.3f} s".format(
        *(pick(VAE, "s_per_img", label=f"flux-2048-1gpu-{v}") for v in ("without", "with"))
    ),
    "fluxvae.2048.peak": lambda: "{:.2f} → {:.2f} GiB".format(
        *(pick(VAE, "peak_gib", label=f"flux-2048-1gpu-{v}") for v in ("without", "with"))
    ),
    "worker.flux.auto": lambda: "{:.3f} img/s ({:.2f} s an image)".format(
        r := pick("h200-fluxworker-call", "steady_after_last_compile_img_per_s", kind="queue", tag="flux-worker-auto"),
        1 / r,
    ),
    # an SDXL CFG pair on 2 H200s (issue 46's done means)
    "done2.b1.worker": lambda: arrow("h200x2-done2-call", "sdxl-1gpu-worker-levers", "sdxl-cfg2"),
    "done2.b4": lambda: arrow("h200x2-done2c-call", "sdxl-1gpu-b4-worker-levers", "sdxl-cfg2-b4"),
    "done2q.b1": lambda: arrow(Q2, "sdxl-1gpu-pair-levers", "sdxl-cfg2"),
    "done2q.dp": lambda: "{:.3f} → {:.3f} img/s ({:.2f}×)".format(
        r1 := pick("h200x2-done2d-call", "steady_img_per_s", gpus=1),
        r2 := pick("h200x2-done2d-call", "steady_img_per_s", gpus=2),
        r2 / r1,
    ),
    "done2q.queue": done2q_queue,
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


def unused(pages: list[Path] = PAGES) -> list[str]:
    """Rows no page shows: a table of what the docs say, not a store of every number ever taken."""
    shown = {name for page in pages for name, _ in FIGURE.findall(page.read_text(encoding="utf-8"))}
    return sorted(set(FIGURES) - shown)


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
    found = problems() + [f"bench/figures.py: {name} is shown by no page (remove its row)" for name in unused()]
    for problem in found:
        print(problem)
    if not found:
        print(f"figures: every figure in {len(PAGES)} pages matches bench/results")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
