"""Measured figures in README and docs, from one source: the raw lines in ``bench/results/``.

A page writes a figure as ``<!-- fig NAME -->TEXT<!-- /fig -->`` (the comments do not render);
TEXT is what the row NAME of :data:`FIGURES` gives: a template filled with numbers picked from
results files (:class:`Pick`: a field of the one line whose fields equal the match) and
arithmetic on them. ``make docs`` rewrites every figure from the files; ``make lint`` runs
``--check``, which prints ``FILE:LINE: NAME says TEXT, bench/results gives VALUE`` for each
figure that drifted, or names an unknown figure, and exits 1. A new measurement is a new
results file and a new row here, never a number typed into a page.

    python bench/figures.py --check     # make lint
    python bench/figures.py --write     # make docs
"""

from __future__ import annotations

import argparse
import json
import operator
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


class Num:
    """A number computed when a page is checked; arithmetic on it makes another (a list
    computes item by item, for :func:`lo` and :func:`hi`)."""

    def value(self) -> Any:
        raise NotImplementedError

    def _op(self, other: Any, op: Callable[[Any, Any], Any], swap: bool = False) -> Num:
        a, b = (other, self) if swap else (self, other)
        return Calc(lambda: _apply(op, _value(a), _value(b)))

    def __add__(self, o: Any) -> Num:
        return self._op(o, operator.add)

    def __sub__(self, o: Any) -> Num:
        return self._op(o, operator.sub)

    def __mul__(self, o: Any) -> Num:
        return self._op(o, operator.mul)

    def __truediv__(self, o: Any) -> Num:
        return self._op(o, operator.truediv)

    def __rtruediv__(self, o: Any) -> Num:
        return self._op(o, operator.truediv, swap=True)


class Calc(Num):
    def __init__(self, compute: Callable[[], Any]) -> None:
        self.compute = compute

    def value(self) -> Any:
        return self.compute()


class Pick(Num):
    """``field`` (``a.b`` reaches into a nested object) of the one line of ``results/FILE.jsonl``
    whose fields equal ``match``; with ``each``, of every such line (a list)."""

    def __init__(self, file: str, field: str, each: bool = False, **match: Any) -> None:
        self.file, self.field, self.each, self.match = file, field, each, match

    def value(self) -> Any:
        found = [x for x in lines(self.file) if all(x.get(k) == v for k, v in self.match.items())]
        if not found or (len(found) > 1 and not self.each):
            raise LookupError(f"{self.file}.jsonl: {len(found)} lines match {self.match}, not 1")
        values = []
        for line in found:
            for part in self.field.split("."):
                line = line[part]
            values.append(line)
        return values if self.each else values[0]


def _value(x: Any) -> Any:
    return x.value() if isinstance(x, Num) else x


def _apply(op: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    if isinstance(a, list):
        return [op(x, b) for x in a]
    return [op(a, x) for x in b] if isinstance(b, list) else op(a, b)


def _flat(values: tuple[Num, ...]) -> list[float]:
    out: list[float] = []
    for x in values:
        v = _value(x)
        out.extend(v if isinstance(v, list) else [v])
    return out


def lo(*values: Num) -> Num:
    return Calc(lambda: min(_flat(values)))


def hi(*values: Num) -> Num:
    return Calc(lambda: max(_flat(values)))


def median(values: Num) -> Num:
    return Calc(lambda: statistics.median(_value(values)))


class Fig:
    """A figure's text: ``template`` (``str.format``) filled with its numbers."""

    def __init__(self, template: str, *values: Any) -> None:
        self.template, self.values = template, values

    def __call__(self) -> str:
        return self.template.format(*(_value(v) for v in self.values))


# the shapes most rows take
def rate(file: str, tag: str) -> Pick:
    """A run through the queue (bench/e2e_queue.py): steady images a second after the first job."""
    return Pick(file, "steady_img_per_s", kind="queue", tag=tag)


def rate_n(file: str, gpus: int) -> Pick:
    return Pick(file, "steady_img_per_s", gpus=gpus)


def first_image(file: str, tag: str) -> Fig:
    return Fig("{:.1f} s", Pick(file, "launch_to_first_image_s", kind="queue", tag=tag))


def span(template: str, *values: Num) -> Fig:
    return Fig(f"{template}–{template}", lo(*values), hi(*values))


def arrow(file: str, before: str, after: str) -> Fig:
    """Seconds an image, one label's against another's in the same call, and the gain."""
    a, b = Pick(file, "s_per_img", label=before), Pick(file, "s_per_img", label=after)
    return Fig("{:.3f} → {:.3f} s ({:.2f}×)", a, b, a / b)


def times(file: str, one: str, many: str) -> Fig:
    """A group's image against one GPU's, bare, in the same call."""
    return Fig("{:.2f}×", Pick(file, "s_per_img", label=one) / Pick(file, "s_per_img", label=many))


def against_one(file: str, label: str, one: str = "flux-1gpu-compiled") -> Fig:
    """A group's seconds an image and its speedup over the call's one GPU (bare lines)."""
    many, alone = (Pick(file, "s_per_img", kind="group-bare", label=x) for x in (label, one))
    return Fig("{:.3f} s ({:.2f}×)", many, alone / many)


def queued(file: str, field: str = "queue_overhead_frac", template: str = "{:.1f} %") -> Fig:
    """A group through the queue (bench/group_queue.py): the queue's share, or another field."""
    pick = Pick(file, field, kind="group-queue")
    return Fig(template, pick * 100 if template.endswith("%") else pick)


def fp8_calls(prefix: str, file: str, base: str = "fp16", fp8: str = "fp8", word: str = "fp16") -> dict[str, Fig]:
    """A call's baseline rate and its fp8 rate, as ``PREFIX.<word>`` and ``PREFIX.fp8``."""
    return {f"{prefix}.{word}": Fig("{:.3f}", rate(file, base)), f"{prefix}.fp8": Fig("{:.3f}", rate(file, fp8))}


#: the newest calls through the queue with the overlapped writer, each on a cold machine
QUEUE_CALLS = ("h100-fp8-call1", "h200-fp8-call1", "h100-fp8-chunk16")
COLD = {
    p: [Pick(f, "launch_to_first_image_s", True, kind="queue", precision=[p]) for f in QUEUE_CALLS]
    for p in ("fp16", "fp8")
}
#: the fp16 defaults through the queue, every call that ran them, by GPU
DEFAULTS = {
    "h100": [rate("h100-defaults-call", "defaults"), rate("h100-rq3-call", "defaults"),
             rate("h100-adapters-direct-call", "defaults"), rate("h100-fp8-call1", "fp16")],
    "h200": [rate("h200-defaults-call", "defaults"), rate("h200-adapters-call", "defaults"),
             rate("h200-fp8-call1", "fp16")],
}  # fmt: skip
G4, Q2, DEC, FUSE = "h100x4-flux4g-call", "h200x2-done2q-call", "h200x2-fluxdecode-call", "h200x2-fusering2-call"
ROUND, FLEET, VAE = "h200x2-rounding2-call", "h100x4-fleet-call2", "h200-fluxvae-call"
FLUX_AUTO = Pick("h200-fluxworker-call", "steady_after_last_compile_img_per_s", kind="queue", tag="flux-worker-auto")
Q2_JOB, Q2_BARE = Pick(Q2, "job_s_median", kind="group-queue"), median(Pick(Q2, "calls", label="sdxl-cfg2"))
Q2_GAP = median(Pick(Q2, "gap_between_jobs_s", kind="group-queue"))
ENQUEUE = {"event": "enqueue alone, new rows (check pass included)"}


def rounded(label: str) -> Fig:
    """A FLUX image rounded on the host (diffusers' PIL output) against on the device: medians."""
    host, device = (f"{kind}_rounding" for kind in ("host", "device"))
    calls = [median(Pick(ROUND, f"{k}.calls", label=label)) for k in (host, device)]
    decodes = [median(Pick(ROUND, f"{k}.decode_s", label=label)) * 1e3 for k in (host, device)]
    return Fig("{:.3f} → {:.3f} s (decode {:.0f} → {:.0f} ms)", *calls, *decodes)


FIGURES: dict[str, Fig] = {
    # one GPU through the queue: defaults, fp8 and its variants (docs/benchmarks.md)
    **fp8_calls("fp8.h100", "h100-fp8-call1"),
    **fp8_calls("fp8.h200", "h200-fp8-call1"),
    "fp8.h100.psnr": Fig("{:.1f} dB", Pick("h100-fp8-call1", "psnr_mean_db", kind="quality")),
    "fp8.h200.psnr": Fig("{:.1f} dB", Pick("h200-fp8-call1", "psnr_mean_db", kind="quality")),
    **fp8_calls("fp8.h100.chunk16", "h100-fp8-chunk16", "fp16-chunk16", "fp8-chunk16"),
    **fp8_calls("fp8.flux", "h100-flux-fp8-call", "flux-fp16", "flux-fp8", word="bf16"),
    "fp8.flux.gain": Fig("{:.2f}×", rate("h100-flux-fp8-call", "flux-fp8") / rate("h100-flux-fp8-call", "flux-fp16")),
    "fp8.flux.psnr": Fig("{:.1f} dB", Pick("h100-flux-fp8-call", "psnr_mean_db", kind="quality")),
    "fp8conv.h100.fp8": Fig("{:.3f}", rate("h100-fp8conv-queue-call2", "fp8")),
    **fp8_calls("fp8fast.h100", "h100-fastacc-queue-call2"),
    "fp8fast.h100.psnr": Fig("{:.1f} dB", Pick("h100-fastacc-queue-call2", "psnr_mean_db", kind="quality")),
    "fp8fast.h100.chunk16.fp8": Fig("{:.3f}", rate("h100-fastacc16-queue-call", "fp8")),
    "act8.h100.chunk16.fp8": Fig("{:.3f}", rate("h100-act8-16-queue-call", "fp8")),
    "gelu.h100.chunk16.fp8": Fig("{:.3f}", rate("h100-gelu-queue-call", "fp8")),
    "persistq.h100.chunk16.fp8": Fig("{:.3f}", rate("h100-persistq-queue-call", "fp8")),
    "batch32.h100.fp8": Fig("{:.3f}", rate("h100-batch32-call", "fp8")),
    "empty.h100.chunk16.fp8": Fig("{:.3f}", rate("h100-empty-queue-call", "fp8")),
    "empty.h100.chunk16.gain": Fig(
        "{:.2f}×", rate("h100-empty-queue-call", "fp8") / rate("h100-empty-queue-call", "fp16")
    ),
    "empty.h100.chunk16.fp8.again": Fig("{:.3f}", rate("h100-empty-queue2-call", "fp8")),
    "empty.h100.fp16.with": Fig("{:.3f}", rate("h100-empty-fp16-call", "fp16en")),
    "empty.h100.fp16.without": Fig("{:.3f}", rate("h100-empty-fp16-call", "fp16")),
    "empty.h200.chunk16.fp8": Fig("{:.3f}", rate("h200-empty-call", "fp8")),
    "defaults.h100": span("{:.3f}", *DEFAULTS["h100"]),
    "defaults.h200": span("{:.3f}", *DEFAULTS["h200"]),
    "queue.share": Fig(
        "{:.1f}–{:.1f} %",
        *(f(*(Pick(c, "queue_overhead_frac", True, kind="queue") * 100 for c in QUEUE_CALLS)) for f in (lo, hi)),
    ),
    "unet.rows.1-2": Fig(
        "{:.2f}×",
        (r := {n: Pick("h100-unet-rows-call1", "step_ms", config="cudagraphs-fp16", unet_batch=n) for n in (1, 2)})[2]
        / r[1],
    ),
    # a worker's first image
    **{f"first-image.cold.{p}": Fig("{:.0f}–{:.0f} s", lo(*COLD[p]), hi(*COLD[p])) for p in ("fp16", "fp8")},
    "first-image.cold.fp8conv": first_image("h100-fp8conv-cold-call", "fp8"),
    "first-image.new-host": first_image("h100-precompile-call", "preB"),
    "first-image.warm": first_image("h100-precompile-call", "preBwarm"),
    "first-image.warm.fp8": first_image("h100-fp8-call2", "adapters-fp8"),
    "first-image.warm.fp8conv": first_image("h100-fp8conv-queue-call2", "fp8"),
    # CPU: make demo, enqueue, a fleet of four through one Redis
    "demo.seconds": Fig("{:.0f}–{:.0f} s", lo(d := Pick("demo-cpu", "seconds", True, rc=0, images=13)), hi(d)),
    "enqueue.rate": Fig(
        "10⁶ rows enqueue in {:.0f} s ({:,} rows/s)",
        *(Pick("campaign-enqueue-1e6", f, **ENQUEUE) for f in ("seconds", "rows_per_s")),
    ),
    "fleet.bulk": Fig("{:.2f} img/s", Pick(FLEET, "img_per_s_after_warm")),
    "fleet.latency.run": Fig("{:.2f} s", Pick(FLEET, "latency_run_s_median")),
    "fleet.latency.wait": Fig("{:.0f} ms", Pick(FLEET, "latency_wait_s_median") * 1000),
    # data parallel: N pinned workers against one (one 4-GPU machine, one call)
    **{
        f"scaling.{n}": Fig("{:.2f}×", rate_n("h200x4-scaling-defaults", n) / rate_n("h200x4-scaling-defaults", 1))
        for n in (2, 4)
    },
    **{f"scaling.vae-fp16.{n}": Fig("{:.2f}×", rate_n("h200x4-queue", n) / rate_n("h200x4-queue", 1)) for n in (2, 4)},
    # groups (docs/groups.md)
    "group.engine.1gpu": Fig("{:.3f} s", Pick("h100-group-engine-call", "s_per_img", kind="group-bare")),
    "worker.run-batch.defaults": Fig(
        "{:.3f} s", Pick("h100-group-engine-call", "s_per_img", kind="pipeline", label="+compile-vae")
    ),
    "group.flux.u2.h100": times("h100x2-flux1024-call", "flux-1gpu-compiled", "flux-u2-compiled"),
    "group.flux.u4": times("h200x4-flux4c-call", "flux-1gpu-compiled", "flux-u4-compiled"),
    "group.flux.u4.queue": queued("h200x4-flux4c-call"),
    "group.flux2048.u2": times("h100x2-flux2048-call", "flux-2048-1gpu", "flux-2048-u2"),
    "group.flux2048.u2.pvae": times("h100x2-flux2048-call", "flux-2048-1gpu", "flux-2048-u2-pvae"),
    "group.flux2048.u2.product": times("h100x2-flux2048g-call", "flux-2048-1gpu", "flux-2048-u2-product"),
    "group.sdxl.cfg2.b4": times("h100x2-sdxl4-call", "sdxl-1gpu-b4", "sdxl-cfg2-b4"),
    "graphs.cfg2.queue": queued("h100x2-graphs2-call", "job_s_median", "{:.3f} s"),
    "flux4g.1gpu": Fig("{:.3f} s", Pick(G4, "s_per_img", label="flux-1gpu-compiled")),
    "flux4g.u4": against_one(G4, "flux-u4-product"),
    "flux4g.u4.nographs": against_one(G4, "flux-u4-nographs"),
    "flux4g.u2": against_one(G4, "flux-u2-product"),
    "flux4g.queue.job": queued(G4, "job_s_median", "{:.3f} s"),
    "flux4g.queue.per-job": Fig(
        "{:.1f} %",
        Pick(G4, "overhead_s_median", kind="group-queue") / Pick(G4, "job_s_median", kind="group-queue") * 100,
    ),
    "flux4g.queue.run": queued(G4),
    "flux4own.r4": times("h100x4-flux4own-call", "flux-1gpu-compiled", "flux-r4-own"),
    "flux4r.r4": times("h100x4-flux4r-call", "flux-1gpu-compiled", "flux-r4-product"),
    "flux4r.u4": times("h100x4-flux4r-call", "flux-1gpu-compiled", "flux-u4-product"),
    "split.fluxgraphs.product": against_one("h100x2-fluxgraphs-call", "flux-u2-product"),
    "split.fluxgraphs.queue": queued("h100x2-fluxgraphs-call"),
    "split.fluxgraphs.queue.job": queued("h100x2-fluxgraphs-call", "job_s_median", "{:.3f} s"),
    "split.fluxring4.r2-own": against_one("h100x2-fluxring4-call", "flux-r2-own"),
    "split.fluxring4.queue": queued("h100x2-fluxring4-call"),
    "decode.split": Fig(
        "{:.3f} / {:.3f} s ({:.2f}× / {:.2f}×)",
        *(ds := [Pick(DEC, "s_per_img", kind="group-bare", label=f"flux-r2-splitdecode{x}") for x in ("", "-again")]),
        *(Pick(DEC, "s_per_img", kind="group-bare", label="flux-1gpu-compiled") / d for d in ds),
    ),
    "rounding.1024.1gpu": rounded("flux-1024-1gpu-rounding"),
    "rounding.1024.ring": rounded("flux-1024-r2-rounding"),
    "fusering.2048": arrow("h200x2-fuse2048-call", "flux-2048-1gpu", "flux-2048-r2-defaults"),
    "fusering.ratio": Fig(
        "{:.3f} → {:.3f} s ({:.2f}×)",
        a := Pick(FUSE, "s_per_img", label="flux-1gpu-compiled"),
        b := lo(*(Pick(FUSE, "s_per_img", label=f"flux-r2-fuseqkv{x}") for x in ("", "-warm", "-warm2"))),
        a / b,
    ),
    "fluxvae.2048": Fig(
        "{:.3f} → {:.3f} s", *(Pick(VAE, "s_per_img", label=f"flux-2048-1gpu-{v}") for v in ("without", "with"))
    ),
    "fluxvae.2048.peak": Fig(
        "{:.2f} → {:.2f} GiB", *(Pick(VAE, "peak_gib", label=f"flux-2048-1gpu-{v}") for v in ("without", "with"))
    ),
    "worker.flux.auto": Fig("{:.3f} img/s ({:.2f} s an image)", FLUX_AUTO, 1 / FLUX_AUTO),
    # an SDXL CFG pair on 2 H200s (issue 46's done means)
    "done2.b1.worker": arrow("h200x2-done2-call", "sdxl-1gpu-worker-levers", "sdxl-cfg2"),
    "done2.b4": arrow("h200x2-done2c-call", "sdxl-1gpu-b4-worker-levers", "sdxl-cfg2-b4"),
    "done2q.b1": arrow(Q2, "sdxl-1gpu-pair-levers", "sdxl-cfg2"),
    "done2q.dp": Fig(
        "{:.3f} → {:.3f} img/s ({:.2f}×)",
        r1 := Pick("h200x2-done2d-call", "steady_img_per_s", gpus=1),
        r2 := Pick("h200x2-done2d-call", "steady_img_per_s", gpus=2),
        r2 / r1,
    ),
    "done2q.queue": Fig(
        "{:.3f} s a job against the bare call's {:.3f} s (medians; +{:.1f} %, with the gap to the next job +{:.1f} %); "
        "beyond the slowest rank's phases {:.1f} ms; {:.1f} % over the run of {} jobs",
        Q2_JOB,
        Q2_BARE,
        (Q2_JOB / Q2_BARE - 1) * 100,
        ((Q2_JOB + Q2_GAP) / Q2_BARE - 1) * 100,
        Pick(Q2, "overhead_s_median", kind="group-queue") * 1e3,
        Pick(Q2, "queue_overhead_frac", kind="group-queue") * 100,
        Pick(Q2, "jobs", kind="group-queue"),
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
