"""End-to-end benchmark through the queue: producer CLI → Redis → `worker launch` → PNGs.

For each GPU count it enqueues ``--images-per-gpu × N`` prompts (sdxl-random, 1024², 30 steps,
CFG 5.0), runs one pinned worker per GPU in burst mode with the model preloaded, and reads
throughput from RQ's own job timestamps. One JSON line per run goes to ``--out``, naming the
GPU, the versions and every setting.

``--adapters none,/tmp/a,/tmp/b`` gives the chunks those adapters in turn (a block of
``--chunk`` rows each), so consecutive jobs switch adapter; ``--samplers euler,dpm++2m-karras``
does the same with samplers (the record's ``switch_ratio``: a job after a switch against the
steady median); ``--score clip=...`` passes the producer's ``--score``, ``--image-format`` its format,
``--negative-prompt mlperf`` gives every row MLPerf SDXL's negative prompt; ``--tag`` labels the record.

    python3 bench/e2e_queue.py --out $OUT/queue.jsonl --gpu-counts 1,2,4 --chunk 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import redis
from rq.job import Job
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import record as bench_record  # noqa: E402

from common.queues import by_model_key, get_queue  # noqa: E402


def environment() -> dict:
    """bench/record.py's fields (commit, machine, versions, command), and torch's and diffusers'
    versions flat as the older lines have them (read in this process, not the worker's)."""
    import diffusers
    import torch

    return {**bench_record.environment(), "torch": torch.__version__, "diffusers": diffusers.__version__}


#: the negative prompt of MLPerf Inference's SDXL benchmark (its reference implementation)
MLPERF_NEGATIVE = "normal quality, low quality, worst quality, low res, blurry, nsfw, nude"


def write_prompts(
    csv: Path, n_images: int, adapters: list[str], samplers: list[str], chunk: int, negative: str = "",
    models: list[str] | None = None,
) -> None:  # fmt: skip
    """``n_images`` rows; with adapters (samplers, models), each block of ``chunk`` rows takes the next one."""
    rows = []
    for i in range(n_images):
        adapter = adapters[(i // chunk) % len(adapters)] if adapters else "none"
        sampler = samplers[(i // chunk) % len(samplers)] if samplers else ""
        model = models[(i // chunk) % len(models)] if models else ""
        rows.append(
            f'"benchmark prompt {i}, a red fox in snow",{"" if adapter == "none" else adapter},{sampler},'
            f'"{negative}",{model}\n'
        )
    csv.write_text("prompt,adapter,sampler,negative_prompt,model\n" + "".join(rows))


def switch_ratio(ordered: list[Job]) -> float | None:
    """The median job that follows a sampler switch against the median one that does not, both
    after the last job that compiled: 1.0 when a switch costs nothing."""
    last = max((i for i, j in enumerate(ordered) if j.return_value().get("compiles")), default=0)
    switched, same = [], []
    for before, job in zip(ordered[last:], ordered[last + 1 :], strict=False):
        took = done_at(job) - job.started_at.timestamp()
        (switched if sampler_of(job) != sampler_of(before) else same).append(took)
    if not switched or not same:
        return None
    return round(sorted(switched)[len(switched) // 2] / sorted(same)[len(same) // 2], 4)


def sampler_of(job: Job) -> str:
    return (job.kwargs.get("spec") or {}).get("params", {}).get("sampler") or ""


def done_at(job: Job) -> float:
    """When the job's images were on disk and recorded: with overlap the writer finishes a job
    after RQ's ``ended_at`` (the end of the job function, i.e. of its GPU work)."""
    return job.return_value().get("written_at") or job.ended_at.timestamp()


def after_last_compile(ordered: list[Job]) -> float | None:
    """Images/s over the jobs after the last one that built a graph (one worker's runs)."""
    last = max((i for i, j in enumerate(ordered) if j.return_value().get("compiles")), default=0)
    rest = ordered[last + 1 :]
    if len(rest) < 2:
        return None
    span = done_at(rest[-1]) - rest[0].started_at.timestamp()
    return round(sum(len(j.return_value()["files"]) for j in rest) / span, 4)


def pipeline_s(job: Job) -> float:
    t = job.return_value()["timings"]
    return t["encode_s"] + t["denoise_s"] + t["decode_s"]


def host_parts(ordered: list[Job]) -> dict:
    """Where a steady job's time goes beside its pipeline call (medians over the jobs after the
    first): ``in_job_host_s`` is the job function's time outside encode, denoise and decode
    (planning, Redis, handing the tail over), ``between_jobs_s`` RQ's time from one job's end to
    the next one's start (completing the previous job, dequeuing, fetching)."""
    rest = ordered[1:]
    if len(rest) < 2:
        return {}
    inside = sorted((j.ended_at - j.started_at).total_seconds() - pipeline_s(j) for j in rest)
    between = sorted((b.started_at - a.ended_at).total_seconds() for a, b in pairwise(rest))
    return {"median_in_job_host_s": round(inside[len(inside) // 2], 4),
            "median_between_jobs_s": round(between[len(between) // 2], 4)}  # fmt: skip


def queue_overhead(ordered: list[Job]) -> float | None:
    """Share of one worker's steady span (second job's start to last job's end) not spent in the
    pipeline call itself: PNG encode and write, metadata, Redis, RQ's own steps between jobs."""
    rest = ordered[1:]
    if len(rest) < 2:
        return None
    span = done_at(rest[-1]) - rest[0].started_at.timestamp()
    return round(1 - sum(pipeline_s(j) for j in rest) / span, 4)


def start_up(log: Path, launched: float) -> dict:
    """Where the time to a worker's first job went, read from the first worker's log lines:
    launch to a serving worker (interpreter, imports, Redis), the model load, the warm-up."""
    import re
    from datetime import datetime

    found: dict = {}
    stamp = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) gpu=\S+ INFO (.*)")
    for line in log.read_text(errors="replace").splitlines():
        match = stamp.search(line)
        if not match:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        message = match[2]
        if " serving queue " in message:
            found.setdefault("launch_to_serving_s", round(at - launched, 2))
        elif seconds := re.search(r"model \S+ ready in ([\d.]+)s", message):
            found.setdefault("load_s", float(seconds[1]))
        elif seconds := re.search(r"compiled for \S+ in ([\d.]+)s", message):
            found.setdefault("warm_up_s", float(seconds[1]))
    return found


#: the keys a fleet shares through --compile-cache redis (docs/usage.md), kept by --keep-fleet
FLEET_KEYS = (b"diffq:compiled:", b"pt2:", b"diffq:memory-profile:")


def run(args: argparse.Namespace, gpus: int, conn: redis.Redis) -> dict:
    queue_name = f"bench{gpus}{args.tag.replace('-', '')}"
    if args.keep_fleet:  # a new host of a fleet: what the fleet shares stays, the rest goes
        for key in conn.scan_iter(count=1000):
            if not key.startswith(FLEET_KEYS):
                conn.delete(key)
    else:
        conn.flushdb()  # a warm machine keeps the last run's Redis: start from nothing
    out_dir = Path(args.work) / queue_name
    shutil.rmtree(out_dir, ignore_errors=True)
    csv = Path(args.work) / f"{queue_name}.csv"
    n_images = args.images_per_gpu * gpus
    adapters = [a for a in args.adapters.split(",") if a]
    samplers = [a for a in args.samplers.split(",") if a]
    negative = MLPERF_NEGATIVE if args.negative_prompt == "mlperf" else args.negative_prompt
    models = [m for m in args.models.split(",") if m]
    write_prompts(csv, n_images, adapters, samplers, args.block or args.chunk, negative, models)
    env = {**os.environ, "REDIS_URL": args.redis_url, "DIFFQ_QUEUE": queue_name, "PYTHONUNBUFFERED": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "producer",
            "enqueue",
            str(csv),
            "--model",
            args.model,
            "--chunk-size",
            str(args.chunk),
            "--steps",
            str(args.steps),
            "--guidance",
            str(args.guidance),
            "--width",
            str(args.size),
            "--height",
            str(args.size),
            "--output",
            str(out_dir),
            *(["--sampler", args.sampler] if args.sampler else []),
            *(["--timestep-spacing", args.timestep_spacing] if args.timestep_spacing else []),
            *(["--score", args.score] if args.score else []),
            *(["--image-format", args.image_format] if args.image_format != "png" else []),
            *(["--decoder", args.decoder] if args.decoder else []),
        ],
        env=env,
        cwd=ROOT,
        check=True,
    )
    launched = time.time()
    log = Path(args.logs) / f"worker-{queue_name}.log"
    with log.open("w") as handle:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "worker",
                "launch",
                "--gpus",
                ",".join(map(str, range(gpus))),
                "--burst",
                "--preload",
                args.model,
                "--speedups",
                args.speedups,
                "--precision",
                args.precision,
                *(["--max-models", str(args.max_models)] if args.max_models > 1 else []),
            ],
            env=env,
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            timeout=args.timeout,
        )
    finished = time.time()
    queue = get_queue(queue_name, conn)
    ids = queue.finished_job_registry.get_job_ids()
    jobs = [j for j in Job.fetch_many(ids, connection=conn, serializer=JSONSerializer) if j]
    starts = [j.started_at.timestamp() for j in jobs]
    ends = [done_at(j) for j in jobs]
    images = sum(len(j.return_value()["files"]) for j in jobs)
    span = max(ends) - min(starts)
    per_worker: dict[str, list[Job]] = {}
    for job in jobs:
        per_worker.setdefault(job.worker_name, []).append(job)
    # steady state: each worker's rate after its first job (which pays cudnn autotuning)
    steady = 0.0
    for wjobs in per_worker.values():
        wjobs.sort(key=lambda j: j.started_at)
        if len(wjobs) > 1:
            rest = wjobs[1:]
            wspan = done_at(rest[-1]) - rest[0].started_at.timestamp()
            steady += sum(len(j.return_value()["files"]) for j in rest) / wspan
    timings = [j.return_value()["timings"] for j in jobs]
    ordered = sorted(jobs, key=lambda j: j.started_at)
    record = {
        "kind": "queue",
        "tag": args.tag,
        **environment(),
        "gpus": gpus,
        "chunk": args.chunk,
        "speedups": args.speedups,
        "precision": sorted({j.return_value().get("precision", "?") for j in jobs}),
        "dtype": os.environ.get("DIFFQ_DTYPE", "auto"),
        "overlap_save": os.environ.get("DIFFQ_OVERLAP_SAVE", "1") not in ("0", "false", "no", "off"),
        "model": args.model,
        "models": models,  # the rows' model cells in blocks (empty: --model for every row)
        "max_models": args.max_models,
        "loads": (said := log.read_text()).count(" ready in "),
        "unloads": said.count("unloading model"),
        "by_model": {k.decode(): int(v) for k, v in sorted(conn.hgetall(by_model_key(queue_name)).items())},
        "size": args.size,
        "steps": args.steps,
        "guidance": args.guidance,
        "sampler": args.sampler or ",".join(samplers),  # empty: the model's own
        "score": args.score,
        "switch_ratio": switch_ratio(ordered),
        "timestep_spacing": args.timestep_spacing or "",
        "negative_prompt": negative,  # every row's (empty: none)
        "image_format": args.image_format,
        "decoder": args.decoder,  # empty: the model's own VAE
        "adapters": adapters,
        "compiles_first_job": ordered[0].return_value().get("compiles"),
        "compiles_after_first_job": sum(j.return_value().get("compiles", 0) for j in ordered[1:]),
        "steady_after_last_compile_img_per_s": after_last_compile(ordered),
        "queue_overhead_frac": queue_overhead(ordered),
        "exit_code": proc.returncode,
        "jobs": len(jobs),
        "images": images,
        "files_on_disk": sum(1 for p in (out_dir / "images").rglob("*") if p.suffix in (".png", ".jpg", ".webp")),
        "img_per_s": round(images / span, 4),
        "steady_img_per_s": round(steady, 4),
        "launch_to_first_image_s": round(min(ends) - launched, 2),
        "launch_to_exit_s": round(finished - launched, 2),
        **start_up(log, launched),
        "median_job_s": round(sorted(e - s for s, e in zip(starts, ends, strict=True))[len(jobs) // 2], 3),
        "median_save_s": round(sorted(t["save_s"] for t in timings)[len(timings) // 2], 4),
        "median_decode_s": round(sorted(t["decode_s"] for t in timings)[len(timings) // 2], 4),
        "median_denoise_s": round(sorted(t["denoise_s"] for t in timings)[len(timings) // 2], 4),
        "median_pipeline_s": round(sorted(pipeline_s(j) for j in jobs)[len(jobs) // 2], 4),
        "median_total_s": round(sorted(t["total_s"] for t in timings)[len(timings) // 2], 4),
        "median_encode_s": round(sorted(t["encode_s"] for t in timings)[len(timings) // 2], 4),
        **host_parts(ordered),
        "workers": sorted(per_worker),
        # each job in order: its adapter, its time from start to done, and what loading or merging
        # the adapter took inside it (the adapter issue's "first job of a new adapter" figure)
        "job_trace": [
            {
                "adapter": (j.kwargs.get("spec") or {}).get("params", {}).get("adapter"),
                "model": (j.kwargs.get("spec") or {}).get("params", {}).get("model"),
                "sampler": sampler_of(j),
                "job_s": round(done_at(j) - j.started_at.timestamp(), 3),
                **{k: j.return_value()["timings"].get(k) for k in ("adapter_s", "denoise_s", "score_s", "total_s")},
                "compiles": j.return_value().get("compiles"),
            }
            for j in ordered
        ],
    }
    return record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--logs", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--work", default="/tmp/diffq-bench")
    ap.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6390/0"))
    ap.add_argument("--gpu-counts", default="1")
    ap.add_argument("--images-per-gpu", type=int, default=48)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--model", default="sdxl-random")
    ap.add_argument("--guidance", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=1024, help="width and height (64 for a CPU smoke run of tiny)")
    ap.add_argument("--speedups", default="auto")
    ap.add_argument("--precision", default="fp16", help="the worker's --precision (fp16 or fp8)")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument(
        "--keep-fleet",
        action="store_true",
        help="keep the run before's shared keys (compiled graphs, torch's remote caches, memory profiles)",
    )
    ap.add_argument(
        "--adapters", default="", help="comma-separated adapters taken in turn by chunks; none = no adapter"
    )
    ap.add_argument("--sampler", default="", help="the rows' sampler (common/samplers.py); empty: the model's own")
    ap.add_argument("--samplers", default="", help="comma-separated samplers taken in turn by blocks of rows")
    ap.add_argument("--block", type=int, default=0, help="rows per adapter or sampler block (0: --chunk's)")
    ap.add_argument("--score", default="", help="the producer's --score (scores in the worker)")
    ap.add_argument("--timestep-spacing", default="", help="the sampler's spacing (leading, linspace, trailing)")
    ap.add_argument("--image-format", default="png", help="the producer's --image-format (png, jpeg:90, webp, ...)")
    ap.add_argument("--decoder", default="", help="the producer's --decoder (taesdxl-random); empty: the VAE")
    ap.add_argument("--negative-prompt", default="", help="every row's negative prompt; mlperf: MLPerf SDXL's")
    ap.add_argument("--models", default="", help="comma-separated models taken in turn by blocks of rows")
    ap.add_argument("--max-models", type=int, default=1, help="the worker's --max-models")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    conn = redis.Redis.from_url(args.redis_url)
    for gpus in [int(g) for g in args.gpu_counts.split(",")]:
        record = run(args, gpus, conn)
        with args.out.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
