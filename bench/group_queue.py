"""A group through the queue: producer CLI → Redis → ``torchrun -m worker.group --burst`` → PNGs.

Enqueues ``--jobs`` one-image jobs, runs the group until the queue is empty, and reads each
job's duration from RQ's own timestamps (``started_at`` → ``ended_at``: claim, broadcast, the
parallel pipeline, images back to rank 0, PNG write, Redis bookkeeping). The first job pays
warm-up and is reported apart. Compare with ``bench/group.py``'s bare latency in the same call.

    python3 bench/group_queue.py --gpus 4 --model flux-random --degrees "--ulysses-degree 4" --out q.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis
from rq.job import Job
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import record as bench_record  # noqa: E402


def done_at(job: Job) -> float:
    """When the job's images were written and recorded (``written_at``, after ``ended_at`` with overlap)."""
    return (job.return_value() or {}).get("written_at") or job.ended_at.timestamp()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--model", default="flux-random")
    ap.add_argument("--degrees", default="")
    ap.add_argument("--jobs", type=int, default=4, help="jobs (of --chunk images each)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=1, help="images per job")
    ap.add_argument("--work", default="/tmp/group-queue")
    ap.add_argument("--variant", default="", help="DIFFQ_BENCH_VARIANT for bench/group_variant.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0"))
    args = ap.parse_args()

    conn = redis.Redis.from_url(args.redis_url)
    conn.flushdb()
    queue = f"group{args.gpus}"
    out_dir = Path(args.work) / queue
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    csv = Path(args.work) / f"{queue}.csv"
    rows = args.jobs * args.chunk
    csv.write_text("prompt\n" + "".join(f'"queue prompt {i}, a red fox in snow"\n' for i in range(rows)))
    env = {**os.environ, "REDIS_URL": args.redis_url, "DIFFQ_QUEUE": queue, "PYTHONUNBUFFERED": "1"}
    enqueue = [sys.executable, "-m", "producer", "enqueue", str(csv), "--model", args.model,
               "--chunk-size", str(args.chunk),
               "--steps", str(args.steps), "--width", str(args.size), "--height", str(args.size),
               "--guidance", str(args.guidance), "--output", str(out_dir)]  # fmt: skip
    subprocess.run(enqueue, env=env, cwd=ROOT, check=True)
    started = time.time()
    group = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.gpus),
             *(["bench/group_variant.py"] if args.variant else ["-m", "worker.group"]),
             "--model", args.model, "--burst", *args.degrees.split()]  # fmt: skip
    env["DIFFQ_BENCH_VARIANT"] = args.variant
    rc = subprocess.run(group, env=env, cwd=ROOT).returncode
    wall = time.time() - started
    jobs = [
        Job.fetch(i, connection=conn, serializer=JSONSerializer)
        for i in FinishedJobRegistry(queue, connection=conn).get_job_ids()
    ]
    jobs.sort(key=lambda j: j.started_at)
    durations = [(j.ended_at - j.started_at).total_seconds() for j in jobs]
    steady = durations[1:] or durations
    gaps = [(b.started_at - a.ended_at).total_seconds() for a, b in itertools.pairwise(jobs)]
    # the job function's own breakdown (rank 0): pipeline, PNG writing, the rest of the job
    parts: dict[str, list[float]] = {}
    for job in jobs[1:] or jobs:
        for key, value in ((job.return_value() or {}).get("timings") or {}).items():
            parts.setdefault(key, []).append(value)
    # what the queue adds to each job: everything but the parallel pipeline call (slowest rank)
    overhead = [
        (j.ended_at - j.started_at).total_seconds()
        - sum((j.return_value() or {}).get("timings", {}).get(k, 0.0) for k in ("encode_s", "denoise_s", "decode_s"))
        for j in (jobs[1:] or jobs)
    ]
    # steady throughput: from the second job's start until the last job's images are written
    # (with overlap, RQ's ended_at is the end of the GPU work; the writer finishes after it)
    rest = jobs[1:]
    span = (done_at(rest[-1]) - rest[0].started_at.timestamp()) if len(rest) >= 2 else None
    pipeline = sum(
        sum((j.return_value() or {}).get("timings", {}).get(k, 0.0) for k in ("encode_s", "denoise_s", "decode_s"))
        for j in rest
    )
    record = {
        "t": round(time.time(), 1),
        "kind": "group-queue",
        **bench_record.environment(),
        "speedups": os.environ.get("DIFFQ_SPEEDUPS", "auto"),
        "overlap_save": os.environ.get("DIFFQ_OVERLAP_SAVE", "1") not in ("0", "false", "no", "off"),
        "steady_s_per_job": round(span / len(rest), 4) if span else None,
        "queue_overhead_frac": round(1 - pipeline / span, 4) if span else None,
        "model": args.model,
        "gpus": args.gpus,
        "degrees": args.degrees,
        "variant": args.variant,
        "rc": rc,
        "jobs": len(jobs),
        "chunk": args.chunk,
        "images": len(list(out_dir.rglob("*.png"))),
        "first_job_s": round(durations[0], 3) if durations else None,
        "job_s_median": round(statistics.median(steady), 4) if steady else None,
        "job_s": [round(d, 4) for d in durations],
        "gap_between_jobs_s": [round(g, 4) for g in gaps],
        "timings_median": {k: round(statistics.median(v), 4) for k, v in parts.items()},
        "overhead_s": [round(o, 4) for o in overhead],
        "overhead_s_median": round(statistics.median(overhead), 4) if overhead else None,
        "wall_s": round(wall, 1),
        # how long the group took to exit by itself (--burst) after writing the last job's images
        "exit_after_last_s": round(started + wall - max(map(done_at, jobs)), 1) if jobs else None,
    }
    print(json.dumps(record), flush=True)
    with open(args.out, "a") as fh:
        fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
