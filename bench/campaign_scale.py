"""A 10^7-image campaign through one Redis, on this machine, without a GPU.

What is real: redis-server (Debian's, no persistence, no maxmemory); the producer CLI
(``python -m producer enqueue``) on a generated N-row CSV with its defaults (chunk 8,
``--max-queued`` 100,000); the diffq RQ worker class (``DiffqWorker``: dequeue, started
registry, heartbeats from its keeper thread, results, finished registry and its trimming,
retries) running the real job function ``worker.serving.task.run_job`` with every Redis write
it makes (progress meta, the ledger's HMGET, BEGIN and COMMIT, counters, the recent-rate set).

What is skipped: the pipeline (a stub backend returns 8×8 images at once), writing the PNGs
(``_save`` returns their metadata records) and appending ``metadata.jsonl`` (its lock and
file are a no-op): 10^7 files do not fit this machine's disk, and none of it touches Redis.

1 job in 100 fails its first attempt (a transient error, retried by RQ after its backoff),
and 1 in 1000 fails for good (``PermanentJobError``), so ``producer retry-failed --all`` has
work to do at the end. Samples go to --out as JSON lines.

    .venv/bin/python bench/campaign_scale.py --rows 10000000 --drivers 3 --out bench/results/campaign-1e7.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the driver: one process running the real worker class with a stub pipeline ------------
def drive(redis_url: str, name: str) -> None:
    from PIL import Image

    import worker.output.destination as destination
    import worker.serving.task as task
    from common.errors import PermanentJobError
    from common.queues import connect, get_queue
    from common.settings import Settings
    from worker.pipelines.pixels import BatchResult
    from worker.serving.rqworker import DiffqWorker
    from worker.serving.runtime import Runtime

    class StubBackend:
        device, dtype, speedups = "cpu", "float32", None

        def get(self, model, on_progress=None):
            return object(), 0.0

        def use_adapters(self, loaded, stack):
            pass

        def generate(self, loaded, batch, on_step=None, on_progress=None):
            prompts = batch.prompts
            tag = hashlib.sha256("".join(prompts).encode()).digest()
            job = task.get_current_job()
            first = job is None or int(job.meta.get("attempts", 1)) == 1
            if first and tag[0] == 0 and tag[1] < 16:  # ~1 job in 1000 fails (until retry-failed --all)
                raise PermanentJobError("bench: a job that fails for good")
            if first and tag[2] < 3:  # ~1 in 100, retried by RQ after its backoff
                raise RuntimeError("bench: a transient failure on the first attempt")
            image = Image.new("RGB", (8, 8))
            return BatchResult([image] * len(prompts), 0.0, 0.0, 0.0), len(prompts)

    def no_save(run, images):
        return [task._item_record(run.chunk, item, key, index) for key, item, index in run.plan.todo]

    class NoLines:
        size = 0

        def files_from(self, offset, files):
            return set()

        def append(self, records):
            pass

    task._save = no_save
    destination.locked_metadata = lambda output: contextlib.nullcontext(NoLines())
    settings = Settings.load(redis_url=redis_url, retry_backoff="1")
    conn = connect(redis_url)
    rt = Runtime(settings, StubBackend(), worker_name=name)
    worker = DiffqWorker([get_queue(settings.queue, conn)], connection=conn, name=name, runtime=rt)
    worker.work(logging_level="WARNING", with_scheduler=False)


# -- the conductor -------------------------------------------------------------------------
def write_rows(path: Path, rows: int) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.write("prompt\n")
        block = []
        for i in range(rows):
            block.append(f"campaign prompt {i} a lighthouse on a cliff at dusk in oil paint\n")
            if len(block) == 100_000:
                out.writelines(block)
                block = []
        out.writelines(block)


def timed_enqueue(cmd: list[str], env: dict[str, str], rows: int) -> dict:
    """Run one ``producer enqueue``: its wall time, rate, exit status, peak RSS and last words."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    return {
        "rows": rows,
        "seconds": round(seconds, 1),
        "rows_per_s": round(rows / seconds),
        "rc": os.waitstatus_to_exitcode(status),
        "producer_peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "said": proc.stdout.read().strip()[-300:],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--drivers", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--enqueue-only", action="store_true", help="time the producer alone on --rows new rows")
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # internal: run one driver against this URL
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        drive(args.drive, args.name)
        return

    import redis

    work = Path(tempfile.mkdtemp(prefix="diffq-campaign-"))
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(work)],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    conn = redis.Redis.from_url(url)
    for _ in range(100):
        with contextlib.suppress(redis.ConnectionError):
            conn.ping()
            break
        time.sleep(0.05)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url, "PYTHONUNBUFFERED": "1"}
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115
    begun = time.time()

    def emit(event: str, **fields) -> None:
        mem = conn.info("memory")
        line = {
            "t": round(time.time() - begun, 1),
            "event": event,
            "used_memory_mb": round(mem["used_memory"] / 1e6, 1),
            "used_memory_peak_mb": round(mem["used_memory_peak"] / 1e6, 1),
            **fields,
        }
        print(json.dumps(line), flush=True)
        out.write(json.dumps(line) + "\n")
        out.flush()

    def status_latency() -> dict:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "producer", "status", "--json"], env=env, cwd=ROOT, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
        from common.queues import connect
        from producer.status import collect

        c = connect(url)
        t = time.perf_counter()
        st = collect(c, "diffq")
        inproc = time.perf_counter() - t
        return {
            "status_cli_s": round(wall, 3),
            "status_collect_s": round(inproc, 4),
            "rc": done.returncode,
            "images": st.images_written,
            "queued": st.queued,
            "finished": st.finished,
            "failed": st.failed,
        }

    drivers: list[subprocess.Popen] = []
    try:
        rows = work / "rows.csv"
        t = time.perf_counter()
        write_rows(rows, args.rows)
        emit(
            "rows written",
            rows=args.rows,
            seconds=round(time.perf_counter() - t, 1),
            file_mb=round(rows.stat().st_size / 1e6, 1),
        )
        emit("status at 0%", **status_latency())
        enqueue_cmd = [sys.executable, "-m", "producer", "enqueue", str(rows), "--model", "tiny", "--width", "64",
                       "--height", "64", "--steps", "2", "--output", str(work / "out")]  # fmt: skip
        if args.enqueue_only:
            cmd = [*enqueue_cmd, "--max-queued", "0"]
            emit("enqueue alone, new rows (check pass included)", **timed_enqueue(cmd, env, args.rows))
            emit("the same file again, all queued", **timed_enqueue(cmd, env, args.rows))
            return
        for i in range(args.drivers):
            cmd = [sys.executable, __file__, "--out", "/dev/null", "--drive", url, "--name", f"driver{i}"]
            log = work / f"driver{i}.log"
            drivers.append(subprocess.Popen(f"exec {' '.join(cmd)} 2> {log}", shell=True, env=env, cwd=ROOT))
        t0 = time.perf_counter()
        # its progress goes to a file: a pipe nobody reads until the end fills up and stops it
        progress_log = open(work / "enqueue.progress", "w")  # noqa: SIM115
        producer = subprocess.Popen(
            enqueue_cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=progress_log, text=True
        )
        peak_rss: list[float] = []
        stop = threading.Event()

        def sample() -> None:
            half = False
            while not stop.wait(10):
                images = int(conn.get("diffq:diffq:images") or 0)
                emit(
                    "sample",
                    images=images,
                    queued=conn.llen("rq:queue:diffq"),
                    producer_running=producer.poll() is None,
                )
                if not half and images >= args.rows // 2:
                    half = True
                    emit("status at 50%", **status_latency())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(producer.pid, 0)
        producer.returncode = os.waitstatus_to_exitcode(status)
        peak_rss.append(usage.ru_maxrss / 1024)
        said = producer.stdout.read().strip().splitlines()
        progress_log.close()
        progress = (work / "enqueue.progress").read_text().strip().splitlines()
        emit(
            "enqueue finished",
            seconds=round(time.perf_counter() - t0, 1),
            rc=producer.returncode,
            producer_peak_rss_mib=round(peak_rss[0], 1),
            said=said[-1] if said else "",
            progress=progress[-3:],
        )

        def settled() -> bool:
            queued = conn.llen("rq:queue:diffq")
            running = conn.zcard("rq:wip:diffq")
            scheduled = conn.zcard("rq:scheduled:diffq")
            return queued == 0 and running == 0 and scheduled == 0

        while not settled():
            time.sleep(5)
        failed = conn.zcard("rq:failed:diffq")
        emit("drained", images=int(conn.get("diffq:diffq:images") or 0), failed=failed)
        t = time.perf_counter()
        retry = subprocess.run(
            [sys.executable, "-m", "producer", "retry-failed", "--all"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        emit(
            "retry-failed --all",
            seconds=round(time.perf_counter() - t, 2),
            rc=retry.returncode,
            said=retry.stdout.strip()[-300:],
        )
        time.sleep(2)
        while not settled():
            time.sleep(5)
        emit("status at 100%", **status_latency())
        items_mb = conn.memory_usage("diffq:diffq:items", samples=1000) / 1e6
        emit(
            "final",
            images=int(conn.get("diffq:diffq:images") or 0),
            items_hash_mb=round(items_mb, 1),
            finished_kept=conn.zcard("rq:finished:diffq"),
            keys=conn.dbsize(),
        )
        # no image was written, so a producer that sees the (empty) output folder would make them all
        # again; without it, it trusts Redis, as a producer on another host than the workers does
        shutil.rmtree(work / "out", ignore_errors=True)
        emit("re-enqueue of the done file", **timed_enqueue(enqueue_cmd, env, args.rows))
        stop.set()
    finally:
        for proc in drivers:
            proc.terminate()
        for proc in drivers:
            with contextlib.suppress(Exception):
                proc.wait(30)
        server.terminate()
        out.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
