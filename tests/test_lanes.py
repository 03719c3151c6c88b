"""A campaign's two lanes (common/lanes.py): jobs for groups (``producer enqueue --latency``) and
jobs for any worker share one campaign. Single workers never take a group job, a group takes its
own lane first and then helps with the rest, and every tool that counts the campaign counts both
lanes. Real redis-server; real workers and a real torchrun group where a worker is named."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, TINY_FLAGS, assert_exactly_once, images_under, kill, producer, run_worker, wait_for
from prometheus_client import generate_latest
from rq.exceptions import DequeueTimeout
from rq.job import Job
from rq.registry import CanceledJobRegistry, FailedJobRegistry
from rq.serializers import JSONSerializer

from common.lanes import LANE_POLL_S, LaneQueue, group_lane
from common.queues import get_queue, recent_key
from common.reconcile import intermediate_key, left
from producer.metrics import registry_for
from producer.status import collect, render

LANE = group_lane("diffq")


def _csv(tmp_path: Path, name: str, prompts: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("prompt\n" + "".join(f"{p}\n" for p in prompts), encoding="utf-8")
    return path


def _enqueue(path: Path, out: Path, *extra: str) -> str:
    result = producer("enqueue", path, *TINY_FLAGS, "--chunk-size", "1", "--output", out, *extra)
    assert result.exit_code == 0, result.output
    return result.output


def test_latency_jobs_go_to_the_group_lane_and_every_tool_counts_both_lanes(env, conn, tmp_path):
    out = tmp_path / "out"
    _enqueue(_csv(tmp_path, "bulk.csv", ["bulk 0", "bulk 1", "bulk 2"]), out)
    said = _enqueue(_csv(tmp_path, "soon.csv", ["soon 0", "soon 1"]), out, "--latency")
    assert f"(its group lane {LANE!r}: only groups take them)" in said
    assert get_queue("diffq", conn).count == 3 and get_queue(LANE, conn).count == 2
    # the same items with or without --latency are the same items: nothing is queued twice
    assert "0 new" in _enqueue(_csv(tmp_path, "soon.csv", ["soon 0", "soon 1"]), out)
    assert "0 new" in _enqueue(_csv(tmp_path, "bulk.csv", ["bulk 0", "bulk 1", "bulk 2"]), out, "--latency")

    place = left(conn, "diffq", ttl=30)
    assert (place.queued, place.for_groups, place.pending, place.images_enqueued) == (5, 2, 5, 5)
    status = collect(conn, "diffq")
    assert (status.queued, status.for_groups, status.waiting_for_a_group) == (5, 2, True)
    text = render(status, "redis")
    assert "queued    5 (2 for groups only)" in text
    assert "waiting   2 job(s) for a group, and no group serves this queue" in text
    assert status.stalled == "no live worker"

    metrics = generate_latest(registry_for(conn, ttl=30)).decode()
    assert 'diffq_jobs{queue="diffq",state="queued"} 5.0' in metrics
    assert 'diffq_jobs_for_groups{queue="diffq"} 2.0' in metrics
    assert "diffq:group" not in metrics  # one campaign, one series

    dry = producer("cancel", "--dry-run")
    assert "would cancel 5 job(s), 5 image(s)" in dry.output, dry.output
    done = producer("cancel")
    assert done.exit_code == 0 and "cancelled 5 job(s)" in done.output, done.output
    assert get_queue("diffq", conn).count == 0 and get_queue(LANE, conn).count == 0
    assert CanceledJobRegistry(LANE, connection=conn).count == 2
    assert collect(conn, "diffq").cancelled == 5
    # and the same enqueue resumes each item in the lane it is asked for
    assert "2 new" in _enqueue(_csv(tmp_path, "soon.csv", ["soon 0", "soon 1"]), out, "--latency")
    assert get_queue(LANE, conn).count == 2 and CanceledJobRegistry(LANE, connection=conn).count == 0


def test_failed_group_jobs_are_counted_and_retried_in_their_lane(env, conn, tmp_path):
    _enqueue(_csv(tmp_path, "soon.csv", ["soon 0"]), tmp_path / "out", "--latency")
    lane = get_queue(LANE, conn)
    job = Job.fetch(lane.job_ids[0], connection=conn, serializer=JSONSerializer)
    conn.lrem(lane.key, 0, job.id)
    job.set_status("failed")
    FailedJobRegistry(queue=lane).add(job, exc_string="boom")
    status = collect(conn, "diffq")
    assert status.failed == 1 and status.failures and status.failures[0].job_id == job.id
    result = producer("retry-failed")
    assert "re-queued 1 failed job(s)" in result.output, result.output
    assert lane.count == 1 and get_queue("diffq", conn).count == 0


def test_a_worker_of_two_lanes_takes_the_first_lane_first_and_keeps_rq_crash_safety(conn):
    """LaneQueue: each lane is taken with LMOVE, so a taken job sits in its lane's intermediate
    list (where the reconciler finds it if the worker dies) and never in no list at all."""
    shared, lane = get_queue("diffq", conn), get_queue(LANE, conn)
    shared.enqueue("os.getcwd", job_id="bulk")
    lane.enqueue("os.getcwd", job_id="soon")
    job, queue = LaneQueue.dequeue_any([lane, shared], 1, connection=conn, serializer=JSONSerializer)
    assert (job.id, queue.name) == ("soon", LANE)
    assert conn.lrange(intermediate_key(LANE), 0, -1) == [b"soon"]
    job, queue = LaneQueue.dequeue_any([lane, shared], None, connection=conn, serializer=JSONSerializer)
    assert (job.id, queue.name) == ("bulk", "diffq")
    assert conn.lrange(intermediate_key("diffq"), 0, -1) == [b"bulk"]
    # a taken job whose worker is gone is lost, in whichever lane it was taken from
    assert sorted(left(conn, "diffq", ttl=30).lost_ids) == ["bulk", "soon"]
    started = time.monotonic()
    with pytest.raises(DequeueTimeout):
        LaneQueue.dequeue_any([lane, shared], 2, connection=conn, serializer=JSONSerializer)
    assert time.monotonic() - started >= 1.5
    # a job queued in the later lane while the worker waits on the first is found within a poll
    later = threading.Timer(1.0, lambda: shared.enqueue("os.getcwd", job_id="late"))
    later.start()
    started = time.monotonic()
    job, queue = LaneQueue.dequeue_any([lane, shared], 30, connection=conn, serializer=JSONSerializer)
    later.join()
    assert (job.id, queue.name) == ("late", "diffq")
    assert time.monotonic() - started < 1.0 + LANE_POLL_S + 5  # generous: a loaded machine


@pytest.mark.worker
@pytest.mark.long
def test_single_workers_leave_group_jobs_and_status_says_they_wait_for_one(env, conn, tmp_path):
    out = tmp_path / "out"
    _enqueue(_csv(tmp_path, "bulk.csv", ["bulk 0", "bulk 1"]), out)
    _enqueue(_csv(tmp_path, "soon.csv", ["soon 0"]), out, "--latency")
    result = run_worker(env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(images_under(out)) == 2
    assert get_queue(LANE, conn).count == 1  # not taken, not failed
    status = collect(conn, "diffq")
    assert status.pending == 1 and not status.complete and status.made_by == {"worker": 2}
    assert producer("wait", "--timeout", "3").exit_code != 0


def _torchrun(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "tests" / "held_group.py"), "--model", "tiny", "--device", "cpu", "--timeout", "10",
        "--data-parallel-degree", "2", "--burst", *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.long
def test_a_group_takes_its_lane_first_then_helps_and_status_says_who_made_what(env, conn, tmp_path):
    out = tmp_path / "out"
    _enqueue(_csv(tmp_path, "bulk.csv", ["bulk 0", "bulk 1"]), out)
    assert run_worker(env).returncode == 0  # 2 images by a single worker
    # then 3 throughput jobs, and last the group's own: the group takes its own first
    _enqueue(_csv(tmp_path, "more.csv", ["more 0", "more 1", "more 2"]), out)
    _enqueue(_csv(tmp_path, "soon.csv", ["soon 0"]), out, "--latency")
    soon = get_queue(LANE, conn).job_ids[0]
    # a job of another model on the shared queue goes back for the single workers, not to failed
    _csv(tmp_path, "other.csv", ["other model"])
    other = producer("enqueue", tmp_path / "other.csv", "--model", "sdxl-random", "--output", out, "--chunk-size", "1")
    assert other.exit_code == 0, other.output
    result = _torchrun(env)
    assert result.returncode == 0, result.stderr[-4000:]
    order = [m.decode().split(":")[0] for m in conn.zrange(recent_key("diffq"), 0, -1)]
    assert len(order) == 6 and order[2] == soon, order  # enqueued last, made first of the group's 4
    assert "holds jobs for sdxl-random and this group serves tiny" in result.stderr
    assert_exactly_once(out, 6)
    status = collect(conn, "diffq")
    assert status.made_by == {"group": 4, "worker": 2}
    assert "made      2 by single-GPU workers, 4 by groups" in render(status, "redis")
    # the other model's job waits for a worker that loads it: queued, not failed
    assert get_queue("diffq", conn).count == 1 and FailedJobRegistry("diffq", connection=conn).count == 0
    assert status.pending == 1


@pytest.mark.slow
@pytest.mark.long
def test_a_job_too_big_for_a_single_worker_goes_to_a_live_group(env, conn, tmp_path):
    """Out of memory at one image on a single worker, with a group serving the campaign: the job
    is handed to the group lane (retries untouched) and the group makes it; nothing fails."""
    out = tmp_path / "out"
    log = tmp_path / "group.log"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "tests" / "held_group.py"), "--model", "tiny", "--device", "cpu", "--timeout", "10",
        "--data-parallel-degree", "2", "--group-jobs-only",
    ]  # fmt: skip
    with open(log, "ab") as handle:
        group = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: collect(conn, "diffq").groups, 180, "the group to serve the queue")
        _enqueue(_csv(tmp_path, "big.csv", ["too big for one GPU"]), out)
        result = run_worker(env | {"DIFFQ_FAULT_OOM_ABOVE": "0"})
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"handed to the group lane {LANE!r}, where a group serves it" in result.stderr
        wait_for(lambda: collect(conn, "diffq").complete, 180, "the group to make the image")
        status = collect(conn, "diffq")
        assert status.made_by == {"group": 1} and status.failed == 0
        job = Job.fetch(conn.zrange(recent_key("diffq"), 0, 0)[0].decode().split(":")[0], connection=conn,
                        serializer=JSONSerializer)  # fmt: skip
        assert job.origin == LANE and job.retries_left == 3  # retries untouched
        assert_exactly_once(out, 1)
    finally:
        group.send_signal(signal.SIGTERM)
        try:
            group.wait(60)
        except subprocess.TimeoutExpired:
            kill(group)
