"""RQ's own worker commands (``rq.command.send_command``) work on a diffq worker: ``stop-job``
stops a running job between two steps (it ends ``stopped``, none of its images written, its
items queued again by the same ``producer enqueue``), and ``shutdown`` stops the worker warm.
Real worker processes, the tiny model, a real redis-server."""

from __future__ import annotations

import pytest
from conftest import SLOW, assert_exactly_once, drain, images_under, kill, producer, running_job, start_worker, wait_for
from rq.command import send_command, send_shutdown_command
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from common.queues import get_queue


def _subscribed(conn, name: str) -> bool:
    """The worker listens on its command channel (RQ's pubsub thread is up)."""
    return bool(conn.pubsub_numsub(f"rq:pubsub:{name}")[0][1])


@pytest.mark.worker
@pytest.mark.long
def test_an_idle_worker_hears_every_command_and_shuts_down_warm_on_rqs_shutdown(env, conn, tmp_path):
    """Before, a stop-job to an idle worker killed RQ's pubsub thread ("'_thread.RLock' object is
    not subscriptable": diffq kept a lock under RQ 3's ``_executions``) and it heard nothing after."""
    log = tmp_path / "w.log"
    worker = start_worker(env, log, "--name", "IDLE")
    try:
        wait_for(lambda: _subscribed(conn, "IDLE"), 240, "the worker listening for commands")
        send_command(conn, "IDLE", "stop-job", job_id="dqnosuchjob")
        send_command(conn, "IDLE", "stop-job", job_id="dqnosuchjob")
        wait_for(lambda: log.read_text().count("command ignored") >= 2, 60, "both commands heard")
        assert _subscribed(conn, "IDLE")
        send_shutdown_command(conn, "IDLE")
        assert worker.wait(60) == 0, log.read_text()
    finally:
        kill(worker)
    text = log.read_text()
    assert "pubsub thread exiting" not in text and "Traceback" not in text, text


@pytest.mark.worker
@pytest.mark.long
def test_rqs_stop_job_stops_a_running_job_before_any_image_and_enqueue_brings_it_back(env, conn, tmp_path):
    rows, out = tmp_path / "p.csv", tmp_path / "out"
    rows.write_text("prompt\n" + "".join(f"stop me {i}\n" for i in range(4)), encoding="utf-8")
    assert producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out).exit_code == 0
    first = get_queue("diffq", conn).job_ids[0]
    log = tmp_path / "w.log"
    worker = start_worker(env, log, "--burst", "--name", "STOPPER")
    try:
        job = wait_for(lambda: running_job(conn, "STOPPER"), 240, "the first job denoising")
        assert job.id == first
        send_command(conn, "STOPPER", "stop-job", job_id=job.id)
        assert worker.wait(240) == 0, log.read_text()  # the other job still ran
    finally:
        kill(worker)
    stopped = Job.fetch(first, connection=conn, serializer=JSONSerializer)
    assert stopped.get_status() == JobStatus.STOPPED, log.read_text()
    assert "stopped on request" in stopped.meta["error"]
    assert len(images_under(out)) == 2  # the other job's; none of the stopped one's
    again = producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out)
    assert again.exit_code == 0 and "2 new" in again.output, again.output
    drain(env, tmp_path / "w2.log")
    assert_exactly_once(out, 4)
