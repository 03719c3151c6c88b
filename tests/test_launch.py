"""`worker launch`: one pinned process per (CPU stand-in) GPU, prefixed logs, supervision."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
import redis
from conftest import (
    EXAMPLES,
    ROOT,
    SLOW,
    TINY_FLAGS,
    alive,
    kill,
    producer,
    running_job,
    wait_for,
    worker_cmd,
    write_csv,
)
from rq import Worker
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from common.queues import get_queue
from worker.supervision.launch import parse_gpus


def test_parse_gpus():
    assert [(s.label, s.visible) for s in parse_gpus("0,2")] == [("0", "0"), ("2", "2")]
    assert [(s.label, s.visible) for s in parse_gpus("cpu,cpu")] == [("cpu0", ""), ("cpu1", "")]
    with pytest.raises(ConfigError, match="listed twice"):
        parse_gpus("1,1")
    with pytest.raises(ConfigError, match="not a GPU index"):
        parse_gpus("gpu0")


def test_gpus_all_means_the_gpus_this_process_may_use():
    """A Slurm job given GPUs 2 and 5 of a node has CUDA_VISIBLE_DEVICES=2,5: one worker each,
    pinned to its own, never GPUs 0 and 1 of the node."""
    assert [(s.label, s.visible) for s in parse_gpus("all", ["2", "5"])] == [("2", "2"), ("5", "5")]
    uuids = ["GPU-1a2b", "GPU-3c4d"]
    assert [s.visible for s in parse_gpus("all", uuids)] == uuids
    assert [s.visible for s in parse_gpus("1", ["2", "5"])] == ["5"]  # indices count within the list
    with pytest.raises(ConfigError, match="not among the 2 this process may use"):
        parse_gpus("0,2", ["2", "5"])
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES is set and empty"):
        parse_gpus("all", [])
    assert [s.visible for s in parse_gpus("cpu", [])] == [""]


@pytest.mark.worker
@pytest.mark.long
def test_launch_under_a_given_cuda_visible_devices_pins_each_worker_to_one_of_them(env, conn):
    given = {**env, "CUDA_VISIBLE_DEVICES": "2,5"}
    proc = subprocess.run(worker_cmd("launch", "--gpus", "all", "--burst"), env=given, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert "(CUDA_VISIBLE_DEVICES='2')" in said and "(CUDA_VISIBLE_DEVICES='5')" in said, said
    assert "CUDA_VISIBLE_DEVICES='0'" not in said
    none = subprocess.run(worker_cmd("launch", "--gpus", "all"), env={**env, "CUDA_VISIBLE_DEVICES": ""}, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert none.returncode == 2 and "CUDA_VISIBLE_DEVICES is set and empty" in none.stderr, none.stderr
    assert "Traceback" not in none.stderr


@pytest.mark.slow
def test_launch_two_workers_drain_the_queue(env, conn, tmp_path):
    enqueued = producer("enqueue", EXAMPLES / "prompts.csv", *TINY_FLAGS, "--output", tmp_path, "--chunk-size", "1")
    assert enqueued.exit_code == 0
    proc = subprocess.run(
        worker_cmd("launch", "--gpus", "cpu,cpu", "--burst"),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    queue = get_queue("diffq", conn)
    assert queue.count == 0
    jobs = Job.fetch_many(queue.finished_job_registry.get_job_ids(), connection=conn, serializer=JSONSerializer)
    assert len(jobs) == 12
    workers = {job.worker_name for job in jobs}
    assert {w.split("-")[1] for w in workers} == {"cpu0", "cpu1"}, workers
    assert "[gpu cpu0]" in proc.stdout and "[gpu cpu1]" in proc.stdout
    assert len(list((tmp_path / "images").rglob("*.png"))) == 13


def _worker_pids(conn) -> list[int]:
    return [int(w.name.rsplit("-", 1)[1]) for w in Worker.all(connection=conn) if w.name.startswith("diffq-cpu")]


@pytest.mark.slow
@pytest.mark.long
def test_children_do_not_outlive_a_killed_launcher_and_give_their_jobs_back(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\nfirst slow one\nsecond slow one\n")
    assert producer("enqueue", rows, *SLOW, "--chunk-size", "1", "--output", tmp_path / "out").exit_code == 0
    with open(tmp_path / "launch.log", "wb") as log:
        launcher = subprocess.Popen(worker_cmd("launch", "--gpus", "cpu,cpu"), env=env, cwd=ROOT, stdout=log)
    try:
        names = lambda: [w.name for w in Worker.all(connection=conn) if w.name.startswith("diffq-cpu")]  # noqa: E731
        wait_for(lambda: sum(bool(running_job(conn, n)) for n in names()) == 2, 180, "both children to denoise")
        children = _worker_pids(conn)
        launcher.kill()  # SIGKILL: no handler runs, nothing is sent to the children
        wait_for(lambda: not any(alive(pid) for pid in children), 600, "the orphaned children to exit")
    finally:
        kill(launcher)
    queue = get_queue("diffq", conn)
    assert queue.count == 2 and StartedJobRegistry(queue=queue).count == 0  # given back, not lost
    assert all("cold shutdown" in job.meta["error"] for job in queue.get_jobs())


@pytest.mark.slow
@pytest.mark.long
def test_ctrl_c_under_tee_stops_the_children(env, conn, tmp_path):
    cmd = " ".join(worker_cmd("launch", "--gpus", "cpu,cpu")) + f" | tee {tmp_path / 'launch.log'}"
    shell = subprocess.Popen(["bash", "-c", cmd], env=env, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(_worker_pids(conn)) == 2, 180, "both children to register")
        children = _worker_pids(conn)
        os.killpg(shell.pid, signal.SIGINT)  # a terminal's Ctrl-C: launcher and tee alike
        wait_for(lambda: not any(alive(pid) for pid in children), 120, "the children to exit")
        assert shell.wait(60) is not None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
    assert _worker_pids(conn) == []


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_launch_stops_within_30s_of_sigterm_with_redis_down(env, tmp_path, aof_redis):
    """Stopping wins over Redis for the launcher too: its children give up on a dead Redis
    within their grace and exit, and so does the launcher; the jobs come back by heartbeat."""
    env = {**env, "REDIS_URL": aof_redis.url}
    conn = redis.Redis.from_url(aof_redis.url)
    with open(tmp_path / "launch.log", "wb") as log:
        launcher = subprocess.Popen(worker_cmd("launch", "--gpus", "cpu,cpu"), env=env, cwd=ROOT, stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: len(_worker_pids(conn)) == 2, 600, "both children to register")
        children = _worker_pids(conn)
        aof_redis.stop()
        wait_for(lambda: "Redis unreachable" in (tmp_path / "launch.log").read_text(), 120, "Redis to be missed")
        launcher.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        launcher.wait(120)
        took = time.monotonic() - signalled
        print(f"launcher exited {took:.1f}s after SIGTERM with Redis down")
        assert took < 40 and not any(alive(pid) for pid in children)
    finally:
        kill(launcher)
