"""One campaign served by single-GPU workers and a group side by side: the fleet chooses.

GPUs ``0 .. W-1`` each run a pinned ``worker run``; the next ``--group-gpus`` GPUs run one group
(``torchrun -m worker.group`` with ``--group-args``). A throughput campaign (``--bulk`` images,
chunks of ``--chunk``) is queued first; once every worker and the group have finished a job
(compiled, warm), ``--latency-jobs`` one-image jobs are queued with ``producer enqueue --latency``,
one every ``--every`` seconds, while the campaign runs. Reported, from RQ's own timestamps: each
latency job's wait (queued to started) and run (started to ended) and who ran it; the campaign's
images/s once warm; the images each kind made (the campaign's made-by count).

    python3 bench/fleet.py --workers 2 --group-gpus 2 --model sdxl-random --group-args=--cfg-parallel --out f.jsonl
    python3 bench/fleet.py --cpu --workers 1 --group-gpus 2 --model tiny --size 64 --steps 4 \\
        --group-args=--data-parallel-degree=2 --bulk 16 --out f.jsonl          # the CPU smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import record as bench_record  # noqa: E402

from common.lanes import group_lane, lanes, made_by_key  # noqa: E402
from common.queues import recent_key  # noqa: E402

QUEUE = "fleet"


def finished(conn: redis.Redis) -> list[Job]:
    ids = [i for lane in lanes(QUEUE) for i in FinishedJobRegistry(lane, connection=conn).get_job_ids()]
    return [j for j in Job.fetch_many(ids, connection=conn, serializer=JSONSerializer) if j is not None]


def done_at(job: Job) -> float:
    return (job.return_value() or {}).get("written_at") or job.ended_at.timestamp()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2, help="single-GPU workers, on GPUs 0..N-1")
    ap.add_argument("--group-gpus", type=int, default=2, help="the group's ranks, on the next GPUs")
    ap.add_argument("--group-args", default="--cfg-parallel", help="the group's split flags")
    ap.add_argument("--model", default="sdxl-random")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--bulk", type=int, default=96, help="images of the throughput campaign")
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--latency-jobs", type=int, default=4)
    ap.add_argument("--every", type=float, default=8.0, help="seconds between two latency jobs")
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--cpu", action="store_true", help="workers and group on the CPU (a smoke run)")
    ap.add_argument("--work", default="/tmp/fleet")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0"))
    args = ap.parse_args()
    began, began_wall = time.monotonic(), time.time()

    conn = redis.Redis.from_url(args.redis_url)
    conn.flushdb()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out_dir = work / "out"
    env = {**os.environ, "REDIS_URL": args.redis_url, "DIFFQ_QUEUE": QUEUE, "PYTHONUNBUFFERED": "1"}
    flags = ["--model", args.model, "--steps", str(args.steps), "--width", str(args.size), "--height",
             str(args.size), "--guidance", str(args.guidance), "--output", str(out_dir)]  # fmt: skip

    def enqueue(name: str, prompts: list[str], *extra: str) -> None:
        csv = work / name
        csv.write_text("prompt\n" + "".join(f'"{p}"\n' for p in prompts))
        subprocess.run([sys.executable, "-m", "producer", "enqueue", str(csv), *flags, *extra], env=env, cwd=ROOT,
                       check=True, capture_output=True)  # fmt: skip

    bulk_prompts = [f"bulk prompt {i}, a red fox in snow" for i in range(args.bulk)]
    enqueue("bulk.csv", bulk_prompts, "--chunk-size", str(args.chunk))
    # one latency job before anything runs: the group compiles its one-image shape while warming up
    enqueue("warm.csv", ["warm-up latency prompt"], "--latency", "--chunk-size", "1")
    device = ["--device", "cpu"] if args.cpu else []
    procs: list[subprocess.Popen] = []
    for gpu in range(args.workers):
        wenv = env | {"CUDA_VISIBLE_DEVICES": "" if args.cpu else str(gpu)}
        log = open(work / f"worker{gpu}.log", "wb")  # noqa: SIM115 - the process owns it
        procs.append(subprocess.Popen([sys.executable, "-m", "worker", "run", *device],
                                      env=wenv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
    gpus = ",".join(str(g) for g in range(args.workers, args.workers + args.group_gpus))
    genv = env | {"CUDA_VISIBLE_DEVICES": "" if args.cpu else gpus}
    log = open(work / "group.log", "wb")  # noqa: SIM115
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.group_gpus),
         "-m", "worker.group", "--model", args.model, *device, *args.group_args.split()],
        env=genv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip

    def left_s() -> float:
        return args.timeout - (time.monotonic() - began)

    # warm: every worker has finished a job, the group a one-image job and a chunk (both shapes
    # compiled; only the first with --group-jobs-only)
    def warm() -> bool:
        jobs = finished(conn)
        group = [j for j in jobs if (j.worker_name or "").startswith("diffq-group")]
        singles = {j.worker_name for j in jobs} - {j.worker_name for j in group}
        served = {group_lane(QUEUE)} if "--group-jobs-only" in args.group_args else set(lanes(QUEUE))
        return len(singles) >= args.workers and {j.origin for j in group} >= served

    while left_s() > 0 and not warm():
        time.sleep(1)
    warm_at = time.time()
    warm_images = sum(int(v) for v in conn.hvals(made_by_key(QUEUE)))
    queued_at: list[float] = []
    for k in range(args.latency_jobs):
        if left_s() <= 0:
            break
        queued_at.append(time.time())
        enqueue(f"soon{k}.csv", [f"latency prompt {k}, a lighthouse at night"], "--latency", "--chunk-size", "1")
        time.sleep(args.every)
    # until the campaign is complete (or the time is up)
    total = args.bulk + 1 + len(queued_at)
    while left_s() > 0 and sum(int(v) for v in conn.hvals(made_by_key(QUEUE))) < total:
        time.sleep(1)
    end_at = time.time()
    made = {k.decode(): int(v) for k, v in conn.hgetall(made_by_key(QUEUE)).items()}
    for proc in procs[:-1]:
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(procs[-1].pid, signal.SIGTERM)  # torchrun and its ranks
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()

    jobs = finished(conn)
    soon = sorted(
        (j for j in jobs if j.origin == group_lane(QUEUE) and j.enqueued_at.timestamp() >= warm_at),
        key=lambda j: j.enqueued_at,
    )
    latency = [
        {
            "wait_s": round((j.started_at - j.enqueued_at).total_seconds(), 3),
            "run_s": round((j.ended_at - j.started_at).total_seconds(), 3),
            "by": j.worker_name,
        }
        for j in soon
    ]
    bulk = [j for j in jobs if j.origin == QUEUE]
    by_worker: dict[str, int] = {}
    for job in bulk:
        by_worker[job.worker_name] = by_worker.get(job.worker_name, 0) + len(
            (job.return_value() or {}).get("files", [])
        )
    group_bulk_runs = [
        (j.ended_at - j.started_at).total_seconds() for j in bulk if (j.worker_name or "").startswith("diffq-group")
    ]
    images_after_warm = sum(made.values()) - warm_images
    recent = conn.zcard(recent_key(QUEUE))
    import torch

    record = {
        "t": round(time.time(), 1),
        "kind": "fleet",
        **bench_record.environment(),
        "gpu": "cpu" if args.cpu else torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "model": args.model,
        "size": args.size,
        "steps": args.steps,
        "workers": args.workers,
        "group_gpus": args.group_gpus,
        "group_args": args.group_args,
        "speedups": os.environ.get("DIFFQ_SPEEDUPS", "auto"),
        "bulk": args.bulk,
        "chunk": args.chunk,
        "complete": sum(made.values()) >= total,
        "made_by": made,
        "bulk_images_by_worker": by_worker,
        "latency_jobs": latency,
        "latency_wait_s_median": round(statistics.median([x["wait_s"] for x in latency]), 3) if latency else None,
        "latency_run_s_median": round(statistics.median([x["run_s"] for x in latency]), 3) if latency else None,
        "group_bulk_job_s_median": round(statistics.median(group_bulk_runs), 3) if group_bulk_runs else None,
        "img_per_s_after_warm": round(images_after_warm / (end_at - warm_at), 4) if end_at > warm_at else None,
        "warm_after_s": round(warm_at - began_wall, 1),
        "jobs_finished": recent,
    }
    print(json.dumps(record), flush=True)
    with args.out.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
