"""``producer cancel``: a campaign stopped without losing what it made, and resumed by the same
``producer enqueue``. Real redis-server; the running-job case uses a real worker process."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import (
    ROOT,
    SLOW,
    TINY_FLAGS,
    assert_exactly_once,
    drain,
    images_under,
    kill,
    producer,
    running_job,
    start_worker,
    wait_for,
)
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry
from rq.serializers import JSONSerializer

from common.queues import get_queue


def _rows(tmp_path, n: int):
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\n" + "".join(f"cancel me {i}\n" for i in range(n)), encoding="utf-8")
    return rows


def test_cancel_removes_queued_jobs_says_so_and_the_same_enqueue_resumes(env, conn, tmp_path):
    rows, out = _rows(tmp_path, 12), tmp_path / "out"
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", out).exit_code == 0
    queue = get_queue("diffq", conn)
    dry = producer("cancel", "--dry-run")
    assert dry.exit_code == 0 and "would cancel 6 job(s), 12 image(s)" in dry.output, dry.output
    assert "nothing was changed" in dry.output and queue.count == 6
    done = producer("cancel")
    assert done.exit_code == 0 and "cancelled 6 job(s), 12 image(s) not yet written: 6 queued" in done.output
    assert queue.count == 0 and CanceledJobRegistry(queue=queue).count == 6
    status = producer("status")
    assert "cancelled 6 (producer cancel; the same producer enqueue resumes them)" in status.output, status.output
    assert producer("wait", "--timeout", "5").exit_code != 0  # not done: nothing was made
    again = producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", out)
    assert again.exit_code == 0 and "12 new" in again.output, again.output
    assert queue.count == 6 and CanceledJobRegistry(queue=queue).count == 0


def test_cancel_stops_an_enqueue_that_tops_the_queue_up(env, conn, tmp_path):
    """An enqueue waiting for room (--max-queued) stops with one line instead of queuing more."""
    rows = _rows(tmp_path, 8)
    cmd = [sys.executable, "-c", "from producer.cli import main; main()", "enqueue", str(rows), *TINY_FLAGS,
           "--chunk-size", "2", "--max-queued", "1", "--output", str(tmp_path / "out")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: get_queue("diffq", conn).count == 1, 120, "the first job queued")
        assert producer("cancel").exit_code == 0
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 6, output
    assert "was cancelled (producer cancel) while this enqueue ran" in output and "Traceback" not in output
    assert get_queue("diffq", conn).count == 0


@pytest.mark.worker
@pytest.mark.long
def test_cancel_stops_a_running_job_before_any_image_and_enqueue_finishes_the_campaign(env, conn, tmp_path):
    rows, out = _rows(tmp_path, 6), tmp_path / "out"
    assert producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out).exit_code == 0
    log = tmp_path / "w.log"
    worker = start_worker(env, log, "--burst", "--name", "C")
    try:
        job = wait_for(lambda: running_job(conn, "C"), 240, "a job denoising")
        result = producer("cancel")
        assert result.exit_code == 0 and "1 running (asked to stop at their next step)" in result.output, result.output
        assert worker.wait(240) == 0, log.read_text()
    finally:
        kill(worker)
    assert Job.fetch(job.id, connection=conn, serializer=JSONSerializer).get_status() == JobStatus.STOPPED
    assert images_under(out) == []  # the stopped job wrote nothing, the cancelled ones never ran
    again = producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out)
    assert again.exit_code == 0 and "6 new" in again.output, again.output
    drain(env, tmp_path / "w2.log")
    assert_exactly_once(out, 6)
    assert producer("wait", "--timeout", "30").exit_code == 0
