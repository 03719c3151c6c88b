"""Faults with real processes against a real redis-server: SIGKILL mid-job, SIGTERM warm and
cold, Redis restarting under running workers. After each: every image exists exactly once,
opens, has one metadata line, and no temp file is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from conftest import (
    ROOT,
    SLOW,
    TINY_FLAGS,
    assert_exactly_once,
    images_under,
    kill,
    producer,
    running_job,
    start_worker,
    wait_for,
    worker_cmd,
)
from rq.job import Job
from rq.registry import FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from common.queues import get_queue

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts


def enqueue(tmp_path: Path, rows: int, chunk: int, flags: tuple[str, ...]) -> Path:
    path = tmp_path / "prompts.csv"
    path.write_text("prompt\n" + "".join(f"fault test prompt {i}\n" for i in range(rows)))
    output = tmp_path / "out"
    result = producer("enqueue", path, *flags, "--chunk-size", str(chunk), "--output", output)
    assert result.exit_code == 0, result.output
    return output


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


@pytest.mark.long
@pytest.mark.soak
def test_sigkill_mid_job_is_requeued_within_90s_and_the_other_worker_finishes_it(env, conn, tmp_path):
    """The promise is the re-queue: within the heartbeat TTL (30 s) and a reaper pass (10 s) of
    the kill, measured by the job's own re-enqueue time. When the other worker then gets to it
    depends on how busy it is (its own jobs first, a loaded box): no clock on that part."""
    output = enqueue(tmp_path, 8, 2, SLOW)
    a = start_worker(env, tmp_path / "a.log", "--name", "A")
    b = start_worker(env, tmp_path / "b.log", "--name", "B")
    try:
        victim = wait_for(lambda: running_job(conn, "A"), 900, "worker A to be denoising a job")
        a.send_signal(signal.SIGKILL)
        killed_at = time.time()
        a.wait(60)

        finished = FinishedJobRegistry("diffq", connection=conn)
        wait_for(lambda: finished.count == 4, 900, "all 4 jobs to finish after the kill", interval=0.5)
        job = Job.fetch(victim.id, connection=conn, serializer=JSONSerializer)
        requeued_s = job.enqueued_at.timestamp() - killed_at
        print(f"job {job.id} re-queued {requeued_s:.1f}s after the SIGKILL, finished by {job.worker_name}")
        assert job.worker_name == "B"
        assert job.meta["abandoned"] == 1
        assert 0 < requeued_s < 90
        assert_exactly_once(output, 8)
        assert stop(b) == 0
    finally:
        for proc in (a, b):
            kill(proc)


@pytest.mark.long  # make test stops workers through tests/test_parts.py's Stops; test_stop's matrix is long too
def test_sigterm_finishes_the_current_job_takes_no_new_one_and_exits_0(env, conn, tmp_path):
    output = enqueue(tmp_path, 6, 2, SLOW)
    worker = start_worker(env, tmp_path / "w.log", "--name", "W")
    try:
        current = wait_for(lambda: running_job(conn, "W"), 600, "the worker to be denoising")
        assert stop(worker, signal.SIGTERM) == 0
        assert Job.fetch(current.id, connection=conn, serializer=JSONSerializer).get_status() == "finished"
        assert get_queue("diffq", conn).count == 2  # the other two jobs were not taken
        assert len(images_under(output)) == 2
    finally:
        kill(worker)


@pytest.mark.long
def test_second_signal_stops_at_once_and_requeues_the_job_at_the_front(env, conn, tmp_path):
    output = enqueue(tmp_path, 6, 2, (*SLOW, "--max-retries", "2"))
    worker = start_worker(env, tmp_path / "w.log", "--name", "W")
    try:
        current = wait_for(lambda: running_job(conn, "W"), 600, "the worker to be denoising")
        worker.send_signal(signal.SIGTERM)
        time.sleep(1.5)  # the same signal twice within a second counts once
        sent = time.monotonic()
        assert stop(worker, signal.SIGTERM, timeout=20) == 1
        assert time.monotonic() - sent < 10
    finally:
        kill(worker)
    queue = get_queue("diffq", conn)
    job = Job.fetch(current.id, connection=conn, serializer=JSONSerializer)
    assert queue.job_ids[0] == current.id
    assert job.get_status() == "queued"
    assert job.retries_left == 2  # not counted as a failure
    assert StartedJobRegistry("diffq", connection=conn).count == 0
    assert "Traceback" not in (tmp_path / "w.log").read_text()

    drain = subprocess.run(
        worker_cmd("run", "--burst", "--device", "cpu"),
        env=env,
        cwd=ROOT,
        timeout=240,
        capture_output=True,
    )
    assert drain.returncode == 0
    assert_exactly_once(output, 6)


@pytest.mark.long
@pytest.mark.soak
def test_redis_restart_loses_nothing_and_workers_and_wait_reconnect(env, aof_redis, tmp_path):
    env = {**env, "REDIS_URL": aof_redis.url}
    os.environ["REDIS_URL"] = aof_redis.url  # the in-process producer
    conn = redis.Redis.from_url(aof_redis.url)
    output = enqueue(tmp_path, 8, 1, (*TINY_FLAGS[:6], "--steps", "30"))
    workers = [start_worker(env, tmp_path / f"w{i}.log", "--name", f"W{i}") for i in range(2)]
    waiter = subprocess.Popen(
        [sys.executable, "-m", "producer", "wait", "--timeout", "240"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        finished = FinishedJobRegistry("diffq", connection=conn)
        wait_for(lambda: finished.count >= 1, 600, "a first job to finish")
        assert finished.count < 8, "too fast to restart Redis mid-run"
        aof_redis.stop()
        time.sleep(2.5)  # Redis down: a fault that lasts, not a wait for work
        assert all(w.poll() is None for w in workers), "a worker died while Redis was down"
        aof_redis.start()
        out, _ = waiter.communicate(timeout=240)
        assert waiter.returncode == 0, out
        assert "drained" in out
        assert finished.count == 8
        assert_exactly_once(output, 8)
        assert all(w.poll() is None for w in workers), "a worker died after Redis came back"
        assert [stop(w) for w in workers] == [0, 0]
        logs = "".join((tmp_path / f"w{i}.log").read_text() for i in range(2))
        assert "Redis unreachable" in logs or "could not connect to Redis" in logs
    finally:
        for proc in (*workers, waiter):
            kill(proc)


C_CALL_STARTS = "one C call starts"
C_CALL_RETURNED = "the C call returned"


def blocking(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """One C call before each batch, like a large VAE decode: Python runs no signal handler in
    the main thread until it returns, which is when the returned path exists."""
    release = tmp_path / "release-the-c-call"
    return {"DIFFQ_FAULT_BLOCK_DECODE": str(release)}, release


@pytest.mark.long
def test_sigterm_is_heard_while_the_main_thread_is_in_a_long_c_call(env, conn, tmp_path):
    output = enqueue(tmp_path, 2, 1, TINY_FLAGS)
    log = tmp_path / "w.log"
    fault, release = blocking(tmp_path)
    worker = start_worker({**env, **fault}, log, "--name", "W")
    try:
        wait_for(lambda: C_CALL_STARTS in log.read_text(), 120, "the worker to enter the long C call")
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: "warm shutdown" in log.read_text(), 120, "the warm shutdown line")
        assert C_CALL_RETURNED not in log.read_text()  # heard while the main thread was in C
        release.touch()
        assert worker.wait(240) == 0
        assert len(images_under(output)) == 1 and get_queue("diffq", conn).count == 1
    finally:
        kill(worker)


@pytest.mark.long
def test_second_signal_during_a_long_c_call_requeues_and_exits_at_once(env, conn, tmp_path):
    enqueue(tmp_path, 2, 1, (*TINY_FLAGS, "--max-retries", "2"))
    log = tmp_path / "w.log"
    fault, _never_released = blocking(tmp_path)
    worker = start_worker({**env, **fault}, log, "--name", "W")
    try:
        wait_for(lambda: C_CALL_STARTS in log.read_text(), 120, "the worker to enter the long C call")
        current = StartedJobRegistry("diffq", connection=conn).get_job_ids()[0]
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: "warm shutdown" in log.read_text(), 120, "the warm shutdown line")
        time.sleep(1.2)  # more than a second later: a second request, not the same one twice
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(120) == 1
        assert C_CALL_RETURNED not in log.read_text()  # it left inside the C call
    finally:
        kill(worker)
    queue = get_queue("diffq", conn)
    job = Job.fetch(current, connection=conn, serializer=JSONSerializer)
    assert queue.job_ids[0] == current and job.retries_left == 2
    assert StartedJobRegistry("diffq", connection=conn).count == 0
