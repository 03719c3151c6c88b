"""Load: 200,000 jobs queued at once. Redis memory per queued job (target at most 2 KiB),
``producer status`` under a second, and the enqueue and drain rates (printed; the figures
in docs/reliability.md come from this test)."""

from __future__ import annotations

import json
import time

import pytest
from conftest import images_under, producer, run_worker

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts

JOBS = 200_000
DRAIN = 200


@pytest.mark.long
@pytest.mark.soak
def test_200k_jobs_fit_in_2kib_each_and_status_answers(env, conn, tmp_path, monkeypatch):
    monkeypatch.setenv("DIFFQ_QUEUE", "load")
    path = tmp_path / "load.csv"
    with open(path, "w") as handle:
        handle.write("prompt\n")
        handle.writelines(f"load test prompt number {i}\n" for i in range(JOBS))
    out = tmp_path / "out"
    before = conn.info("memory")["used_memory"]

    started = time.perf_counter()
    result = producer(
        "enqueue", path, "--model", "tiny", "--width", "64", "--height", "64", "--steps", "1",
        "--chunk-size", "1", "--output", out, "--max-queued", "0",  # all at once: this measures queued jobs
    )  # fmt: skip
    enqueue_s = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    assert f"enqueued {JOBS} job(s)" in result.output

    per_job = (conn.info("memory")["used_memory"] - before) / JOBS
    started = time.perf_counter()
    status = producer("status", "--json")
    status_s = time.perf_counter() - started
    assert json.loads(status.output)["jobs"]["queued"] == JOBS
    assert per_job <= 2048, f"{per_job:.0f} bytes per queued job"

    started = time.perf_counter()
    worker = run_worker({**env, "DIFFQ_QUEUE": "load"}, "--max-jobs", str(DRAIN))
    drain_s = time.perf_counter() - started
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert len(images_under(out)) == DRAIN
    assert json.loads(producer("status", "--json").output)["jobs"]["queued"] == JOBS - DRAIN
    print(
        f"\nload: {JOBS} jobs enqueued in {enqueue_s:.1f}s ({JOBS / enqueue_s:.0f} jobs/s), "
        f"{per_job:.0f} B of Redis memory per queued job, status in {status_s * 1000:.0f} ms, "
        f"{DRAIN} tiny jobs drained by one CPU worker in {drain_s:.1f}s incl. start-up "
        f"({DRAIN / drain_s:.1f} jobs/s)"
    )
