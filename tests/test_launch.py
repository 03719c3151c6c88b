"""`worker launch`: one pinned process per (CPU stand-in) GPU, prefixed logs, supervision."""

from __future__ import annotations

import subprocess

import pytest
from conftest import EXAMPLES, ROOT, TINY_FLAGS, producer, worker_cmd
from rq.job import Job
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from common.queues import get_queue
from worker.launch import parse_gpus


def test_parse_gpus():
    assert [(s.label, s.visible) for s in parse_gpus("0,2")] == [("0", "0"), ("2", "2")]
    assert [(s.label, s.visible) for s in parse_gpus("cpu,cpu")] == [("cpu0", ""), ("cpu1", "")]
    with pytest.raises(ConfigError, match="listed twice"):
        parse_gpus("1,1")
    with pytest.raises(ConfigError, match="not a GPU index"):
        parse_gpus("gpu0")


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
