"""Chaos: three workers drain 120 jobs while a seeded driver SIGKILLs, SIGSTOPs/SIGCONTs and
restarts them at random moments and restarts Redis (AOF) once. Afterwards every image exists
once, opens, has one metadata line, the counter equals the files, and nothing is left queued,
running or failed. ``DIFFQ_CHAOS_SEED=<n>`` replays a run's schedule of faults."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from conftest import assert_exactly_once, kill, producer, start_worker, wait_for, write_csv
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from common.queues import get_queue, images_key, intents_key
from worker.serving.recovery import requeue_abandoned

SEED = int(os.environ.get("DIFFQ_CHAOS_SEED", "20261123"))
JOBS = 120
WORKERS = 3
CHAOS_S = 45.0
TTL_S = 6


def test_a_job_stuck_in_rqs_intermediate_list_goes_back_to_the_queue(conn):
    queue = get_queue("q", conn)
    job = queue.enqueue("worker.task.run_job", kwargs={"spec": {}}, job_id="dqstuck")
    conn.lmove(queue.key, queue.intermediate_queue_key)  # a worker took it, then died at once
    assert queue.count == 0
    assert requeue_abandoned(queue, stuck_after_s=0) == [job.id]
    assert queue.job_ids == [job.id] and conn.llen(queue.intermediate_queue_key) == 0


class Fleet:
    """The workers under chaos: restarts what died, resumes what was stopped, counts faults."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stopped: dict[str, float] = {}  # name -> when to SIGCONT
        self.faults: Counter[str] = Counter()
        for i in range(WORKERS):
            self.start(f"W{i}")

    def start(self, name: str) -> None:
        self.procs[name] = start_worker(self.env, self.logs / f"{name}.log", "--name", name)

    def tend(self) -> None:
        for name, proc in self.procs.items():
            if name in self.stopped and time.monotonic() >= self.stopped[name]:
                proc.send_signal(signal.SIGCONT)
                del self.stopped[name]
            if proc.poll() is not None and name not in self.stopped:
                self.faults["restart"] += 1
                self.start(name)

    def strike(self, rng: random.Random) -> None:
        # every draw is made whatever happens next, so a seed replays the same schedule
        name = rng.choice(sorted(self.procs))
        action = rng.choice(["sigkill", "sigstop", "sigterm"])
        stall = TTL_S + rng.uniform(1.0, 4.0)  # past the heartbeat TTL
        proc = self.procs[name]
        if name in self.stopped or proc.poll() is not None:
            return
        self.faults[action] += 1
        if action == "sigkill":
            kill(proc)
        elif action == "sigstop":
            proc.send_signal(signal.SIGSTOP)
            self.stopped[name] = time.monotonic() + stall
        else:
            proc.send_signal(signal.SIGTERM)  # finishes its job, exits 0; tend() restarts it

    def calm(self) -> None:
        for name in list(self.stopped):
            self.procs[name].send_signal(signal.SIGCONT)
            del self.stopped[name]
        self.tend()

    def stop(self) -> list[int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return [proc.wait(120) for proc in self.procs.values()]


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_chaos_every_image_exactly_once(env, tmp_path, monkeypatch, aof_redis):
    rng = random.Random(SEED)
    server = aof_redis
    # one thread each: three workers with two OpenMP threads apiece on two cores spin against each other
    env = {**env, "REDIS_URL": server.url, "DIFFQ_HEARTBEAT_TTL": str(TTL_S), "OMP_NUM_THREADS": "1"}
    monkeypatch.setenv("REDIS_URL", server.url)
    conn = redis.Redis.from_url(server.url)
    out = tmp_path / "out"
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"chaos prompt {i}\n" for i in range(JOBS)))
    flags = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "4", "--chunk-size", "1")
    assert producer("enqueue", rows, *flags, "--output", out).exit_code == 0
    fleet = Fleet(env, tmp_path)
    started = time.monotonic()
    redis_restart_at = started + rng.uniform(10.0, CHAOS_S - 10.0)
    try:
        while time.monotonic() - started < CHAOS_S:
            time.sleep(rng.uniform(0.5, 2.5))
            fleet.tend()
            fleet.strike(rng)
            if redis_restart_at and time.monotonic() >= redis_restart_at:
                redis_restart_at = 0.0
                fleet.faults["redis restart"] += 1
                server.stop()
                time.sleep(rng.uniform(1.0, 2.5))
                server.start()
        fleet.calm()
        queue = get_queue("diffq", conn)
        finished = FinishedJobRegistry(queue=queue)

        def drained() -> bool:
            fleet.tend()
            return finished.count + FailedJobRegistry(queue=queue).count >= JOBS

        wait_for(drained, 600, "the queue to drain after the chaos", interval=1.0)
        codes = fleet.stop()
    finally:
        for proc in fleet.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                kill(proc)
    print(f"chaos seed {SEED}: {dict(fleet.faults)} in {CHAOS_S:.0f}s; drained {time.monotonic() - started:.0f}s in")
    assert codes == [0] * WORKERS
    assert FailedJobRegistry(queue=queue).count == 0
    assert queue.count == 0 and StartedJobRegistry(queue=queue).count == 0
    assert ScheduledJobRegistry(queue=queue).count == 0
    assert all(job.get_status() == JobStatus.FINISHED for job in Job.fetch_many(
        finished.get_job_ids(), connection=conn, serializer=JSONSerializer))  # fmt: skip
    assert_exactly_once(out, JOBS)
    assert int(conn.get(images_key("diffq"))) == JOBS
    assert conn.hlen(intents_key("diffq")) == 0
    assert fleet.faults["sigkill"] and fleet.faults["sigstop"] and fleet.faults["redis restart"] == 1
