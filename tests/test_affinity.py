"""A worker takes queued jobs of the model it holds warm first (worker/serving/affinity.py):
a file whose rows alternate two models makes one load of each, not one a job; the move keeps
every job in the queue exactly once."""

from __future__ import annotations

import json
import re

import pytest
from conftest import assert_exactly_once, drain, kill, producer, start_worker, write_csv
from rq.job import Job

from common.queues import get_queue
from worker.serving.affinity import job_model, prefer_held

#: six one-row jobs, the models in turn: tiny-pixart by its cell, tiny-sd3 by --model
ROWS = "prompt,model\n" + "".join(f"row {i},{'tiny-pixart' if i % 2 == 0 else ''}\n" for i in range(6))
FLAGS = ("--model", "tiny-sd3", "--width", "64", "--height", "64", "--steps", "2", "--chunk-size", "1")


def test_the_first_job_of_a_held_model_moves_to_the_front_and_nothing_else_changes(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", ROWS)
    assert producer("enqueue", rows, *FLAGS, "--output", tmp_path / "out").exit_code == 0
    queue = get_queue("diffq", conn)
    before = queue.get_job_ids()
    models = [job_model(conn.hget(Job.key_for(i), "data")) for i in before]
    assert models == ["tiny-pixart", "tiny-sd3"] * 3  # the rows' order
    assert prefer_held(conn, [queue.key], set()) is None  # a worker that holds nothing takes the front
    assert prefer_held(conn, [queue.key], {"tiny-pixart"}) is None  # the front is its model already
    moved = prefer_held(conn, [queue.key], {"tiny-sd3"})
    assert moved == before[1]
    after = queue.get_job_ids()
    assert after == [before[1], before[0], *before[2:]] and sorted(after) == sorted(before)
    assert prefer_held(conn, [queue.key], {"other"}) is None and queue.get_job_ids() == after


@pytest.mark.worker
def test_a_file_of_two_models_in_turn_loads_each_once_on_a_worker_that_holds_one(env, conn, tmp_path):
    out = tmp_path / "out"
    rows = write_csv(tmp_path / "p.csv", ROWS)
    assert producer("enqueue", rows, *FLAGS, "--output", out).exit_code == 0
    before = json.loads(producer("status", "--json").output)["by_model"]
    assert before == {m: {"enqueued": 3, "written": 0} for m in ("tiny-pixart", "tiny-sd3")}
    log = tmp_path / "w.log"
    drain(env, log)
    assert_exactly_once(out, 6)
    status = producer("status").output
    assert "tiny-pixart: 3 of 3 images written" in status and "tiny-sd3: 3 of 3 images written" in status, status
    loads = re.findall(r"model (\S+) ready in", log.read_text())
    assert loads == ["tiny-pixart", "tiny-sd3"], loads  # not six: pixart's jobs, then sd3's
    assert log.read_text().count("unloading model") == 1  # one model warm at a time (--max-models 1)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert sorted(line["model"] for line in lines) == ["tiny-pixart"] * 3 + ["tiny-sd3"] * 3
    again = producer("enqueue", rows, *FLAGS, "--output", out)
    assert again.exit_code == 0 and "0 new" in again.output, again.output


@pytest.mark.worker
@pytest.mark.long
def test_a_worker_that_keeps_two_models_warm_loads_each_once_and_unloads_nothing(env, conn, tmp_path):
    """``--max-models 2``: both models stay warm; the rows' order is served without a reload."""
    out = tmp_path / "out"
    assert producer("enqueue", write_csv(tmp_path / "p.csv", ROWS), *FLAGS, "--output", out).exit_code == 0
    log = tmp_path / "w.log"
    worker = start_worker(env, log, "--burst", "--max-models", "2")
    try:
        assert worker.wait(400) == 0, log.read_text()
    finally:
        kill(worker)
    assert_exactly_once(out, 6)
    text = log.read_text()
    assert re.findall(r"model (\S+) ready in", text) == ["tiny-pixart", "tiny-sd3"], text
    assert "unloading model" not in text, text
