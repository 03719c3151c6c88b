"""The worker's environment is not the job's fault: a full or read-only disk pauses the worker
(jobs stay queued, retries untouched), a model it cannot load fails at most two jobs, and
what the producer can check is refused before anything is enqueued. Real worker processes,
a real redis-server and a real tmpfs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import TINY_FLAGS, assert_exactly_once, kill, producer, run_worker, start_worker, wait_for, write_csv
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from common.queues import get_queue, images_key


def log_text(path: Path) -> str:
    return path.read_text(errors="replace")


@pytest.mark.slow
def test_full_then_read_only_disk_pauses_the_worker_and_loses_no_job(env, conn, small_disk, tmp_path):
    out = small_disk / "out"
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"disk prompt {i}\n" for i in range(6)))
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", out).exit_code == 0
    out.mkdir()
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (free - (200 << 10)))  # 200 KiB left: less than a job needs
    log = tmp_path / "w.log"
    worker = start_worker(env, log, "--name", "W")
    try:
        # 1. full: the job goes back, nothing fails, the worker says why once and waits
        wait_for(lambda: "paused, jobs stay queued" in log_text(log), 120, "the worker to pause")
        queue = get_queue("diffq", conn)
        assert queue.count == 3 and FailedJobRegistry(queue=queue).count == 0
        assert StartedJobRegistry(queue=queue).count == 0
        assert all(job.retries_left == 3 for job in queue.get_jobs())
        status = producer("status").output
        assert "paused" in status and "free some space" in status, status
        filler.unlink()
        finished = FinishedJobRegistry(queue=queue)
        wait_for(lambda: finished.count == 3, 120, "the queue to drain once space is back", interval=0.5)
        assert "resumed after" in log_text(log)

        # 2. read-only: the same, found while writing
        rows2 = write_csv(tmp_path / "q.csv", "prompt\nread only a\nread only b\n")
        assert producer("enqueue", rows2, *TINY_FLAGS, "--chunk-size", "2", "--output", out).exit_code == 0
        subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
        wait_for(lambda: log_text(log).count("paused, jobs stay queued") == 2, 120, "a second pause")
        assert queue.count == 1 and FailedJobRegistry(queue=queue).count == 0
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
        wait_for(lambda: finished.count == 4, 120, "the last job once the disk is writable", interval=0.5)

        text = log_text(log)
        assert "Traceback" not in text
        assert_exactly_once(out, 8)
        assert int(conn.get(images_key("diffq"))) == 8
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0
    finally:
        kill(worker)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_model_no_worker_loads_fails_only_once_two_workers_failed_it_the_same_way(env, conn, tmp_path):
    bad = write_csv(tmp_path / "bad.csv", "prompt\n" + "".join(f"bad model {i}\n" for i in range(6)))
    flags = ("--width", "64", "--height", "64", "--steps", "3", "--chunk-size", "1")
    assert producer("enqueue", bad, "--model", "some/nonexistent-hub-id", *flags).exit_code == 0
    good = write_csv(tmp_path / "good.csv", "prompt\ngood one\ngood two\n")
    assert producer("enqueue", good, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    first = run_worker({**env, "HF_HUB_OFFLINE": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    queue = get_queue("diffq", conn)
    failed = FailedJobRegistry(queue=queue)
    # one worker failing to load is its own environment: every job given back, none failed
    assert failed.count == 0 and queue.count == 6 and FinishedJobRegistry(queue=queue).count == 1
    log = first.stderr
    assert log.count("takes no more jobs for it") == 1
    assert "Traceback" not in log
    assert len(re.split(r"\n(?=\d{4}-\d\d-\d\d )", log)) < 50, log  # one line per event
    second = run_worker({**env, "HF_HUB_OFFLINE": "1"})  # another worker, the same failure: the job's
    assert second.returncode == 0, second.stderr[-3000:]
    # the jobs both workers tried failed the same way twice: those (and only those) are the job's fault
    assert failed.count >= 1 and failed.count + queue.count == 6
    for job_id in failed.get_job_ids():
        job = queue.fetch_job(job_id)
        assert job.meta["permanent"] and len(job.meta["load_failures"]) == 2
    reason = producer("status").output
    assert "cannot be loaded: not in this worker's cache" in reason and "stacktrace" not in reason


@pytest.mark.slow
@pytest.mark.long
def test_a_fleet_with_one_broken_model_cache_fails_no_job(env, conn, cache_dir, tmp_path):
    """3 workers, one of them with a truncated safetensors file in its own cache: that worker
    gives its jobs back and stops taking the model; the other two make every image."""
    broken = tmp_path / "broken-cache"
    shutil.copytree(cache_dir, broken)
    weights = next(p for p in broken.rglob("*.safetensors") if "unet" in str(p))
    weights.write_bytes(weights.read_bytes()[:100])
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"fleet {i}\n" for i in range(12)))
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", tmp_path / "out").exit_code == 0
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    workers = [start_worker({**env, "DIFFQ_CACHE": str(broken)}, logs[0], "--burst")]
    wait_for(lambda: "given back" in logs[0].read_text(), 600, "the broken worker to give a job back")
    workers += [start_worker(env, log, "--burst") for log in logs[1:]]
    try:
        for worker in workers:
            assert worker.wait(600) == 0
    finally:
        for worker in workers:
            kill(worker)
    queue = get_queue("diffq", conn)
    assert FailedJobRegistry(queue=queue).count == 0 and queue.count == 0
    assert_exactly_once(tmp_path / "out", 12)
    assert "Traceback" not in logs[0].read_text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--model", "tinyy"), "is neither a preset (did you mean 'tiny'?)"),
        (("--model", "/no/such/folder"), "is neither a preset"),
        (("--model", "tiny", "--adapter", "/no/such/dora"), "--adapter: adapter '/no/such/dora' does not exist here"),
    ],
)
def test_enqueue_refuses_what_it_can_know_is_wrong(env, conn, tmp_path, flags, message):
    rows = write_csv(tmp_path / "p.csv", "prompt\na\n")
    result = producer("enqueue", rows, *flags)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert conn.dbsize() == 0


def test_enqueue_names_the_row_whose_adapter_is_missing(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt,adapter\nfine,tiny-dora\nbroken,/no/such/dora.safetensors\n")
    result = producer("enqueue", rows, *TINY_FLAGS)
    assert result.exit_code == 2
    assert f"{rows}:3: adapter '/no/such/dora.safetensors' does not exist here" in result.output
    assert conn.dbsize() == 0


@pytest.mark.slow
@pytest.mark.long
def test_a_job_whose_folder_is_a_file_is_given_back_and_valid_jobs_behind_it_run(env, conn, tmp_path):
    """One job's folder (a file took its place after the enqueue) is that job's problem on
    this worker: it goes back for other workers and the worker does not pause; a second
    worker that fails the same way proves it is the job's own, and fails it for good."""
    afile = tmp_path / "afile"
    first = write_csv(tmp_path / "first.csv", "prompt\nin a file's place\n")
    assert producer("enqueue", first, *TINY_FLAGS, "--output", afile).exit_code == 0
    afile.write_text("a file where the folder should be")
    good = write_csv(tmp_path / "good.csv", "prompt\nvalid one\nvalid two\n")
    assert producer("enqueue", good, *TINY_FLAGS, "--chunk-size", "1", "--output", tmp_path / "out").exit_code == 0
    one = run_worker(env)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "paused" not in one.stderr and "Traceback" not in one.stderr
    queue = get_queue("diffq", conn)
    assert FinishedJobRegistry(queue=queue).count == 2 and queue.count == 1
    assert FailedJobRegistry(queue=queue).count == 0
    two = run_worker(env)
    assert two.returncode == 0, two.stderr[-3000:]
    (failed,) = FailedJobRegistry(queue=queue).get_job_ids()
    job = queue.fetch_job(failed)
    assert job.meta["permanent"] and "File exists" in job.meta["error"]
    assert_exactly_once(tmp_path / "out", 2)
