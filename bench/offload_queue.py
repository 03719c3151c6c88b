"""``worker --offload`` and memory-sized batches through the queue, under GPU memory caps.

Each spec ``MODE@GB[:SIDE][xIMAGES]`` (``auto@8``, ``none@24``, ``sequential@8x2``,
``auto@8:512x16``) enqueues IMAGES prompts (sdxl-random, SIDE², 30 steps, CFG 5, chunk 8) on a
fresh queue and drains it with one ``worker run --burst --offload MODE --gpu-memory GB`` on GPU
0. Every run shares one cache folder, so the memory profiles measured by one run are read by
the next: a spec repeated later shows a known GPU starting with no probe. One JSON line per run:
img/s (all jobs, and after the first), the GPU peak per job (the worker's own reading), the
batch and offload the jobs ran with, what ``auto`` chose and why, out-of-memory splits, failed
jobs.

    python3 bench/offload_queue.py --out $OUT/offload-queue.jsonl --speedups vae-fp16 \\
        auto@24 auto@16 auto@12 auto@8 none@8x8 auto@8:512x16 sequential@8x2 auto@8x8
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq.job import Job
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.e2e_queue import done_at, environment  # noqa: E402
from bench.offload import emit  # noqa: E402
from common.queues import get_queue  # noqa: E402

SPEC = re.compile(r"^(auto|none|model|sequential)@(\d+(?:\.\d+)?)(?::(\d+))?(?:x(\d+))?$")


def after(text: str, marker: str, keep: bool = False) -> str | None:
    """What follows ``marker`` on the first log line that has it (with the marker: ``keep``)."""
    for line in text.splitlines():
        if marker in line:
            rest = line.split(marker, 1)[1]
            return marker.strip() + " " + rest if keep else rest
    return None


def run(args: argparse.Namespace, spec: str, index: int, conn: redis.Redis) -> dict:
    match = SPEC.match(spec)
    if match is None:
        raise SystemExit(f"spec {spec!r}: use MODE@GB[:SIDE][xIMAGES]")
    mode, cap, side, images = match[1], float(match[2]), int(match[3] or 1024), int(match[4] or args.images)
    queue = f"off{index}"
    work = Path(args.work)
    out_dir, csv = work / queue, work / f"{queue}.csv"
    conn.flushdb()  # a warm machine keeps the last call's Redis and folders: start from nothing
    shutil.rmtree(out_dir, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    csv.write_text("prompt\n" + "".join(f'"offload benchmark {i}, a red fox in snow"\n' for i in range(images)))
    env = {
        **os.environ,
        "REDIS_URL": args.redis_url,
        "DIFFQ_QUEUE": queue,
        "DIFFQ_CACHE": args.cache,
        "PYTHONUNBUFFERED": "1",
    }
    size = ["--width", str(side), "--height", str(side)]
    subprocess.run(
        [sys.executable, "-m", "producer", "enqueue", str(csv), "--model", args.model, "--chunk-size", "8",
         "--steps", str(args.steps), *size, "--output", str(out_dir)],
        env=env, cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    log = Path(args.logs) / f"worker-{queue}-{mode}-{cap:g}gb-{side}.log"
    launched = time.time()
    with log.open("w") as handle:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "worker", "run", "--device", args.device, "--burst", "--speedups", args.speedups,
                 "--offload", mode, "--gpu-memory", f"{cap:g}"],
                env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, timeout=args.timeout,
            )  # fmt: skip
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    text = log.read_text()
    q = get_queue(queue, conn)
    jobs = [j for j in Job.fetch_many(q.finished_job_registry.get_job_ids(), conn, serializer=JSONSerializer) if j]
    jobs.sort(key=lambda j: j.started_at)
    results = [j.return_value() for j in jobs]
    made = sum(len(r["files"]) for r in results)
    record: dict = {
        "kind": "offload-queue", **environment(), "spec": spec, "offload": mode, "cap_gib": cap, "size": side,
        "steps": args.steps, "speedups": args.speedups, "model": args.model, "exit": code,
        "images_asked": images, "images": made, "pngs": len(list((out_dir / "images").rglob("*.png"))),
        "jobs": len(jobs), "failed_jobs": len(q.failed_job_registry.get_job_ids()),
        "oom_splits": text.count("out of memory at batch"), "probes": text.count("memory probe: batch"),
        "auto": after(text, "offload auto: "), "batch_line": after(text, " INFO batch ", keep=True),
        "job_batches": [r.get("batch") for r in results],
        "job_offload": sorted({str(r.get("offload")) for r in results}),
        "job_peak_gib": [r.get("gpu_peak_gib") for r in results],
    }  # fmt: skip
    if jobs:
        ends = [done_at(j) for j in jobs]
        record["launch_to_first_image_s"] = round(min(ends) - launched, 1)
        record["img_per_s"] = round(made / (max(ends) - jobs[0].started_at.timestamp()), 3)
        if len(jobs) > 1:
            rest = sum(len(r["files"]) for r in results[1:])
            record["steady_img_per_s"] = round(rest / (max(ends) - ends[0]), 3)
    return record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--logs", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--work", default="/tmp/diffq-offload")
    ap.add_argument("--cache", default="/tmp/diffq-offload-cache")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0"))
    ap.add_argument("--model", default="sdxl-random")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script with --model tiny")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--images", type=int, default=24)
    ap.add_argument("--speedups", default="vae-fp16")
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--budget-s", type=float, default=500)
    args = ap.parse_args()
    began = time.monotonic()
    conn = redis.Redis.from_url(args.redis_url)
    for index, spec in enumerate(args.specs):
        if time.monotonic() - began > args.budget_s:
            emit(args.out, {"kind": "skipped", "spec": spec, "why": "budget"})
            continue
        emit(args.out, run(args, spec, index, conn))


if __name__ == "__main__":
    main()
