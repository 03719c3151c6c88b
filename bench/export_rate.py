"""Export rate and peak memory of ``producer export`` on this machine (no GPU needed).

Writes N small PNGs (16×16, the worker's names and metadata lines; tests/synthetic.py) to a
local folder, and the same objects plus per-job metadata parts (8 lines each, as chunk 8
writes them) to a local S3-compatible server (moto, started here). Then runs the real CLI,
``python -m producer export``, once per case, each in its own process, and reads that
process's peak RSS from ``wait4``. One JSON line per case goes to --out.

    .venv/bin/python bench/export_rate.py --images 100000 --out bench/results/export-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from synthetic import png, write_local  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd: list[str], env: dict[str, str]) -> dict:
    """Run ``cmd``; wall time, exit status, peak RSS (MiB) and the last line it printed."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "rc": proc.returncode,
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "said": out.strip().splitlines()[-1] if out.strip() else "",
    }


def start_moto(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto did not start")


def upload(records: list[dict], local: Path, endpoint: str, bucket: str) -> float:
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench"
    )
    s3.create_bucket(Bucket=bucket)
    started = time.perf_counter()

    def put(rec: dict) -> None:
        s3.put_object(Bucket=bucket, Key=f"out/{rec['file_name']}", Body=(local / rec["file_name"]).read_bytes())

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, records))
        parts = [records[i : i + 8] for i in range(0, len(records), 8)]

        def put_part(pair: tuple[int, list[dict]]) -> None:
            body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in pair[1]).encode()
            s3.put_object(Bucket=bucket, Key=f"out/metadata/dq{pair[0]:08d}.0.jsonl", Body=body)

        list(pool.map(put_part, enumerate(parts)))
    return time.perf_counter() - started


def merge_only(lines: int, out_path: Path) -> None:
    """Step 1 and 2 of an export alone (merge, external sort, dedup) on ``lines`` synthetic
    metadata lines in one metadata.jsonl, with the default sort buffer; no images are read."""
    import resource

    from synthetic import record

    from common.storage import Store
    from producer.export import ExportOptions, ExportReport, sorted_records

    work = Path(tempfile.mkdtemp(prefix="diffq-merge-bench-"))
    try:
        with open(work / "metadata.jsonl", "w", encoding="utf-8") as meta:
            for i in range(lines):
                meta.write(json.dumps(record(i, lines // 2), sort_keys=True) + "\n")
        size = (work / "metadata.jsonl").stat().st_size
        report = ExportReport()
        started = time.perf_counter()
        merged = sorted_records(Store(str(work)), ExportOptions(format="webdataset"), work, report)
        seconds = time.perf_counter() - started
        line = {"case": "merge + sort + dedup", "lines": lines, "metadata_mb": round(size / 1e6, 1),
                "seconds": round(seconds, 1), "lines_per_s": round(lines / seconds),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "merged_mb": round(merged.stat().st_size / 1e6, 1)}  # fmt: skip
        print(json.dumps(line), flush=True)
        with open(out_path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--s3-images", type=int, default=None, help="images for the S3 cases (default: --images)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--formats", default="webdataset,parquet", help="local -> local cases to run")
    parser.add_argument("--skip-group", action="store_true")
    parser.add_argument("--merge-lines", type=int, help="only time the metadata merge and sort of this many lines")
    args = parser.parse_args()
    if args.merge_lines:
        merge_only(args.merge_lines, args.out)
        return
    work = Path(tempfile.mkdtemp(prefix="diffq-export-bench-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    results = []

    def record(case: str, **fields) -> None:
        line = {"case": case, "images": fields.pop("images", args.images), **fields}
        print(json.dumps(line), flush=True)
        results.append(line)

    try:
        src = work / "src"
        src.mkdir()
        started = time.perf_counter()
        records = write_local(src, args.images)
        record("write synthetic output", seconds=round(time.perf_counter() - started, 1), png_bytes=len(png(0)))
        cli = [sys.executable, "-m", "producer", "export"]
        for fmt in args.formats.split(","):
            r = run([*cli, str(src), "--to", str(work / f"local-{fmt}"), "--format", fmt], env)
            record(f"local -> local {fmt}", **r, images_per_s=round(args.images / r["seconds"], 1))
            shutil.rmtree(work / f"local-{fmt}")
        if not args.skip_group:
            group = [*cli, str(src), "--to", str(work / "group"), "--format", "webdataset", "--group-by", "prompt"]
            r = run(group, env)
            record(
                "local -> local webdataset --group-by prompt", **r, images_per_s=round(args.images / r["seconds"], 1)
            )
            r = run(group, env)
            record("the same again (every shard kept)", **r, images_per_s=round(args.images / r["seconds"], 1))
        if not args.skip_s3:
            n = args.s3_images or args.images
            port = free_port()
            moto = start_moto(port)
            endpoint = f"http://127.0.0.1:{port}"
            try:
                seconds = upload(records[:n], src, endpoint, "bench")
                record("upload to moto (16 threads, boto3)", images=n, seconds=round(seconds, 1))
                s3env = {**env, "DIFFQ_S3_ENDPOINT_URL": endpoint}
                r = run([*cli, "s3://bench/out", "--to", str(work / "s3-wds"), "--format", "webdataset"], s3env)
                record("s3 (moto) -> local webdataset", images=n, **r, images_per_s=round(n / r["seconds"], 1))
                r = run([*cli, "s3://bench/out", "--to", "s3://bench/shards", "--format", "webdataset"], s3env)
                record("s3 (moto) -> s3 (moto) webdataset", images=n, **r, images_per_s=round(n / r["seconds"], 1))
            finally:
                moto.terminate()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        save(args.out, results)


def save(path: Path, results: list[dict]) -> None:
    """Append the JSON lines of a run to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        for line in results:
            out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
