"""Not collected by itself (its name is no ``test_*.py``): tests/test_suite_stops.py runs it in a
pytest of its own, then signals that pytest. Each test starts what a real test starts, says
where it is in ``STOP_TARGET_PIDS`` (JSON: what it started, by name) and waits to be stopped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import start_worker
from rq.serializers import JSONSerializer

from common.queues import get_queue


def ready(**pids: int) -> None:
    path = Path(os.environ["STOP_TARGET_PIDS"])
    path.with_suffix(".tmp").write_text(json.dumps(pids))
    path.with_suffix(".tmp").rename(path)


@pytest.mark.worker
def test_servers_and_a_worker_process(redis_server, s3_server, env, tmp_path):
    worker = start_worker(env, tmp_path / "worker.log", "--name", "target")
    ready(redis=redis_server.proc.pid, s3=s3_server.proc.pid, worker=worker.pid)
    while True:
        time.sleep(0.1)


def test_a_worker_in_pytests_own_process(redis_server, conn):
    """RQ's worker, as tests/test_states.py runs diffq's, installs its own Ctrl-C handler in
    this process; it must not take the session's stop."""
    from worker.serving.rqworker import DiffqWorker

    ready(redis=redis_server.proc.pid)
    worker = DiffqWorker([get_queue("stop-target", conn)], connection=conn, serializer=JSONSerializer)
    worker.work(burst=False)  # an empty queue: waits for a job until stopped
