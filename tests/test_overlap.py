"""Overlap: a job's images are written and recorded on the writer thread while the next job
denoises (worker/serving/overlap.py). Real worker processes, tiny model, real redis-server.

``DIFFQ_FAULT_HOLD_WRITER`` holds the writer until a file exists, so every step below waits on
a state it can see (a job denoising, a file, a process exit), never on the clock."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from conftest import SLOW, assert_exactly_once, images_under, kill, producer, start_worker, wait_for
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from common.queues import get_queue, images_key


def _jobs(conn, ids):
    return [Job.fetch(i, connection=conn, serializer=JSONSerializer) for i in ids]


def _denoising(conn, job_id: str) -> bool:
    """Is ``job_id`` at least two steps into denoising?"""
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    return job.get_status() == JobStatus.STARTED and (job.meta.get("step") or 0) >= 2


def _drain(env, log) -> None:
    """A fresh burst worker until the queue is empty; it must exit 0."""
    worker = start_worker(env, log, "--burst", "--name", "DRAIN")
    try:
        assert worker.wait(300) == 0, log.read_text()
    finally:
        kill(worker)


def _enqueue(tmp_path, n_jobs: int):
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\n" + "".join(f"overlap prompt {i}\n" for i in range(2 * n_jobs)), encoding="utf-8")
    out = tmp_path / "out"
    result = producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.worker
@pytest.mark.long
def test_the_next_job_denoises_while_the_writer_holds_the_last_ones_images(env, conn, tmp_path):
    out = _enqueue(tmp_path, 3)
    ids = list(get_queue("diffq", conn).job_ids)
    hold = tmp_path / "release"
    log = tmp_path / "w.log"
    worker = start_worker({**env, "DIFFQ_FAULT_HOLD_WRITER": str(hold)}, log, "--name", "OV")
    try:
        # job 2 is denoising while job 1's images are still in the writer: nothing on disk yet
        wait_for(lambda: _denoising(conn, ids[1]), 600, "the second job denoising")
        first = _jobs(conn, ids[:1])[0]
        assert first.get_status() == JobStatus.STARTED  # not finished before its images are written
        assert images_under(out) == []
        # a warm stop now: it finishes the running job, then both tails, and takes no third job
        worker.send_signal(signal.SIGTERM)
        hold.touch()
        assert worker.wait(240) == 0, log.read_text()
    finally:
        kill(worker)
    one, two, three = _jobs(conn, ids)
    assert one.get_status() == two.get_status() == JobStatus.FINISHED
    assert three.get_status() == JobStatus.QUEUED
    # job 1's images were written after job 2 had started: the overlap happened
    assert one.latest_result().return_value["written_at"] > two.started_at.timestamp()
    assert_exactly_once(out, 4)
    assert int(conn.get(images_key("diffq"))) == 4
    assert not conn.zcard(get_queue("diffq", conn).started_job_registry.key)


@pytest.mark.slow
@pytest.mark.long
def test_a_worker_killed_with_images_in_the_writer_loses_nothing(env, conn, tmp_path):
    out = _enqueue(tmp_path, 3)
    ids = list(get_queue("diffq", conn).job_ids)
    fast = {**env, "DIFFQ_HEARTBEAT_TTL": "6"}
    first = start_worker(
        {**fast, "DIFFQ_FAULT_HOLD_WRITER": str(tmp_path / "never")}, tmp_path / "a.log", "--name", "A"
    )
    try:
        wait_for(lambda: _denoising(conn, ids[1]), 600, "the second job denoising")
    finally:
        kill(first)  # job 1 in the writer, job 2 on the GPU: both die with it
    assert images_under(out) == []
    _drain(fast, tmp_path / "b.log")
    assert [j.get_status() for j in _jobs(conn, ids)] == [JobStatus.FINISHED] * 3
    assert_exactly_once(out, 6)
    assert int(conn.get(images_key("diffq"))) == 6
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert len({line["file_name"] for line in lines}) == 6


@pytest.mark.worker
@pytest.mark.long
def test_a_full_disk_found_by_the_writer_gives_the_job_back_and_pauses(env, conn, small_disk, tmp_path):
    """The writer's failure takes the same path as one in the job function: the job goes back to
    the front of the queue, retries untouched, and the worker pauses instead of failing jobs."""
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\nfull disk a\nfull disk b\n", encoding="utf-8")
    out = small_disk / "out"
    assert producer("enqueue", rows, *SLOW, "--chunk-size", "2", "--output", out).exit_code == 0
    (job_id,) = get_queue("diffq", conn).job_ids
    hold = tmp_path / "release"
    log = tmp_path / "w.log"
    worker = start_worker({**env, "DIFFQ_FAULT_HOLD_WRITER": str(hold)}, log, "--name", "FULL")
    try:
        wait_for(lambda: "writer holds" in log.read_text(), 600, "the writer holding the images")
        free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        (small_disk / "filler").write_bytes(b"\0" * free)  # the disk fills up while the writer waits
        hold.touch()
        wait_for(lambda: "paused, jobs stay queued" in log.read_text(), 120, "the worker pausing")
        job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        assert job.get_status() == JobStatus.QUEUED and job.retries_left == 3
        assert get_queue("diffq", conn).job_ids == [job_id]
        assert FailedJobRegistry(queue=get_queue("diffq", conn)).count == 0
        assert not conn.get(images_key("diffq"))
        (small_disk / "filler").unlink()
        wait_for(lambda: job.get_status() == JobStatus.FINISHED, 600, "the job done once space is back")
    finally:
        kill(worker)
    assert_exactly_once(out, 2)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_cold_stop_gives_back_the_job_in_the_writer_and_the_running_one(env, conn, tmp_path):
    out = _enqueue(tmp_path, 3)
    ids = list(get_queue("diffq", conn).job_ids)
    log = tmp_path / "w.log"
    worker = start_worker({**env, "DIFFQ_FAULT_HOLD_WRITER": str(tmp_path / "never")}, log, "--name", "COLD")
    try:
        wait_for(lambda: _denoising(conn, ids[1]), 600, "the second job denoising")
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: "warm shutdown" in log.read_text(), 120, "the warm shutdown line")
        time.sleep(1.2)  # more than a second later: a second request, not the same one twice
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(120) == 1, log.read_text()
    finally:
        kill(worker)
    queue = get_queue("diffq", conn)
    # both back at the front, retries untouched; the third was never taken
    assert sorted(queue.job_ids[:2]) == sorted(ids[:2]) and queue.job_ids[2] == ids[2]
    assert all(j.retries_left == 3 for j in _jobs(conn, ids))
    assert not conn.zcard(queue.started_job_registry.key)
    assert images_under(out) == []
    _drain(env, tmp_path / "d.log")
    assert_exactly_once(out, 6)
    assert int(conn.get(images_key("diffq"))) == 6
