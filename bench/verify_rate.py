"""Rate and peak memory of ``producer verify`` on this machine (no GPU needed).

Writes N items (one small PNG each, the worker's names and metadata lines; tests/synthetic.py)
to a local folder, marks them done in a real redis-server's ledger (started here), and runs
the real CLI, ``python -m producer verify``, in its own process, reading its peak RSS from
``wait4``. With --s3-images, the same against a local S3-compatible server (moto, started
here) with per-job metadata parts of 8 lines. One JSON line per case goes to --out.

    .venv/bin/python bench/verify_rate.py --images 1000000 --s3-images 5000 --out bench/results/verify-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from export_rate import free_port, run, save, start_moto  # noqa: E402
from synthetic import png, record  # noqa: E402


def write(out: Path, n: int) -> list[dict]:
    blob = png(0)
    records = [record(i, max(1, n // 2)) | {"num_images": 1} for i in range(n)]
    for folder in {r["file_name"][:9] for r in records}:
        (out / folder).mkdir(parents=True, exist_ok=True)
    with open(out / "metadata.jsonl", "w", encoding="utf-8") as meta:
        for rec in records:
            with open(out / rec["file_name"], "wb") as image:
                image.write(blob)
            meta.write(json.dumps(rec, sort_keys=True) + "\n")
    return records


def ledger(url: str, records: list[dict], queue: str) -> None:
    import redis

    conn = redis.Redis.from_url(url)
    for start in range(0, len(records), 10_000):
        conn.hset(f"diffq:{queue}:items", mapping={r["key"]: "done" for r in records[start : start + 10_000]})
    conn.set(f"diffq:{queue}:images", len(records))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=1_000_000)
    parser.add_argument("--s3-images", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        ledger(args.redis, write(args.generate, args.images), "local")
        return
    work = Path(tempfile.mkdtemp(prefix="diffq-verify-bench-"))
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": url}
    results = []

    def note(case: str, **fields) -> None:
        line = {"case": case, **fields}
        print(json.dumps(line), flush=True)
        results.append(line)

    try:
        time.sleep(0.5)
        src = work / "out"
        started = time.perf_counter()
        # in a process of its own: the CLI's peak RSS (wait4) must not start from this process's
        # 10^6 records, which a fork would lend it
        subprocess.run([sys.executable, __file__, "--generate", str(src), "--images", str(args.images),
                        "--redis", url, "--out", str(args.out)], check=True)  # fmt: skip
        note("write synthetic output and ledger", images=args.images, seconds=round(time.perf_counter() - started, 1))
        cli = [sys.executable, "-m", "producer", "verify"]
        r = run([*cli, str(src), "--queue", "local"], env)
        note("verify local folder", images=args.images, **r, items_per_s=round(args.images / r["seconds"]))
        if args.s3_images:
            from export_rate import upload

            n = args.s3_images
            moto_port = free_port()
            moto = start_moto(moto_port)
            endpoint = f"http://127.0.0.1:{moto_port}"
            try:
                records = [record(i, max(1, args.images // 2)) | {"num_images": 1} for i in range(n)]
                for rec in records[:n]:
                    (src / rec["file_name"]).write_bytes(png(0))
                upload(records[:n], src, endpoint, "bench")
                ledger(url, records[:n], "s3")
                s3env = {**env, "DIFFQ_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
                         "AWS_SECRET_ACCESS_KEY": "bench"}  # fmt: skip
                r = run([*cli, "s3://bench/out", "--queue", "s3"], s3env)
                note("verify s3 (moto), 8-line parts", images=n, **r, items_per_s=round(n / r["seconds"]))
            finally:
                moto.terminate()
    finally:
        server.terminate()
        shutil.rmtree(work, ignore_errors=True)
        save(args.out, results)


if __name__ == "__main__":
    main()
