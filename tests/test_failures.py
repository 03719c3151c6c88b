"""Failure classification: permanent failures fail at once, out-of-memory splits the batch,
transient errors retry with backoff (and a burst worker waits for those retries)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_FLAGS, images_under, producer, run_worker, write_csv
from faults import InjectedFault
from rq.exceptions import DeserializationError
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException

from common.errors import AdapterNotFound, InvalidJobSpec, ModelLoadError, OutOfMemory, OutputNotWritable
from common.queues import get_queue
from worker.serving.failures import classify


@pytest.mark.parametrize(
    ("exc", "permanent", "reason"),
    [
        (AdapterNotFound("adapter /x not found on this worker"), True, "adapter /x not found on this worker"),
        (ModelLoadError("model m cannot be loaded"), True, "model m cannot be loaded"),
        (OutputNotWritable("output folder /o is not writable"), True, "output folder /o is not writable"),
        (InvalidJobSpec("width 3 is outside 64..4096"), True, "width 3 is outside 64..4096"),
        (OutOfMemory("out of memory even for one image"), True, "out of memory even for one image"),
        (DeserializationError("bad"), True, "payload is not a diffq JSON job"),
        (RuntimeError("driver hiccup\nmore lines"), False, "RuntimeError: driver hiccup"),
        (InjectedFault("injected"), False, "InjectedFault: injected"),
        (JobTimeoutException("took too long"), False, "JobTimeoutException: took too long"),
        (torch.OutOfMemoryError("CUDA out of memory"), False, "OutOfMemoryError: CUDA out of memory"),
    ],
)
def test_classify(exc, permanent, reason):
    failure = classify(exc)
    assert failure.permanent is permanent
    assert failure.reason.startswith(reason)
    assert "\n" not in failure.reason


def enqueue(tmp_path, text: str, *flags: str):
    path = write_csv(tmp_path / "p.csv", text)
    result = producer("enqueue", path, *TINY_FLAGS, "--output", tmp_path / "out", *flags)
    assert result.exit_code == 0, result.output
    return tmp_path / "out"


def only_job(conn, status: str | None = None) -> Job:
    ids = conn.keys("rq:job:*")
    jobs = [Job.fetch(k.decode().split(":", 2)[2], connection=conn, serializer=JSONSerializer) for k in ids]
    jobs = [j for j in jobs if status is None or j.get_status() == status]
    assert len(jobs) == 1
    return jobs[0]


@pytest.mark.slow
@pytest.mark.long
def test_an_adapter_missing_on_two_workers_fails_for_good_in_one_line_and_the_worker_goes_on(env, conn, tmp_path):
    text = "prompt,adapter\nneeds an adapter,/nonexistent/dora\nplain prompt,\n"
    out = enqueue(tmp_path, text, "--max-retries", "3", "--no-path-checks")  # only workers see the path
    first = run_worker(env)  # missing here may be this worker's mount: given back, not failed
    assert first.returncode == 0
    assert not conn.zcard("rq:failed:diffq") and get_queue("diffq", conn).count == 1
    worker = run_worker(env)  # a second worker, the same reason: the job's own fault
    assert worker.returncode == 0
    failed = only_job(conn, "failed")
    assert failed.meta["permanent"] is True and len(failed.meta["load_failures"]) == 2
    assert "/nonexistent/dora" in failed.meta["error"] and "retrying" not in failed.meta["error"]
    assert "Traceback" not in worker.stderr and worker.stderr.count("failed: ") == 1  # one line, no traceback
    assert only_job(conn, "finished").meta["attempts"] == 1
    assert len(images_under(out)) == 1
    status = producer("status")
    assert "/nonexistent/dora" in status.output


@pytest.mark.slow
def test_out_of_memory_splits_the_batch_and_finishes(env, conn, tmp_path):
    out = enqueue(tmp_path, "prompt\na\nb\nc\nd\n", "--chunk-size", "4")
    worker = run_worker({**env, "DIFFQ_FAULT_OOM_ABOVE": "1"})
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert "out of memory at batch 4; splitting into 2 + 2" in worker.stderr
    assert "out of memory at batch 2; splitting into 1 + 1" in worker.stderr
    job = only_job(conn, "finished")
    assert job.meta["split_batch"] == 1 and job.meta["attempts"] == 1
    assert len(images_under(out)) == 4


@pytest.mark.slow
@pytest.mark.long
def test_out_of_memory_at_batch_one_fails_at_once(env, conn, tmp_path):
    enqueue(tmp_path, "prompt\na\nb\n", "--chunk-size", "2", "--max-retries", "3")
    worker = run_worker({**env, "DIFFQ_FAULT_OOM_ABOVE": "0"})
    assert worker.returncode == 0
    job = only_job(conn, "failed")
    assert job.meta["attempts"] == 1
    assert job.meta["error"].startswith("out of memory even for one 64x64 image with 'tiny'")


@pytest.mark.slow
def test_transient_failures_retry_with_backoff_and_burst_waits_for_them(env, conn, tmp_path, monkeypatch):
    out = enqueue(tmp_path, "prompt\na\n", "--max-retries", "3", "--retry-backoff", "1,2")
    worker = run_worker({**env, "DIFFQ_FAULT_FAIL_ATTEMPTS": "2"})
    assert worker.returncode == 0
    assert "a retry is scheduled; waiting" in worker.stderr
    job = only_job(conn, "finished")
    assert job.meta["attempts"] == 3 and job.retries_left == 1
    assert len(images_under(out)) == 1


@pytest.mark.slow
@pytest.mark.long
def test_transient_failures_stop_at_the_retry_limit(env, conn, tmp_path, monkeypatch):
    enqueue(tmp_path, "prompt\na\n", "--max-retries", "1", "--retry-backoff", "1")
    worker = run_worker({**env, "DIFFQ_FAULT_FAIL_ATTEMPTS": "9"})
    assert worker.returncode == 0
    job = only_job(conn, "failed")
    assert job.meta["attempts"] == 2
    assert job.meta["error"] == "InjectedFault: injected transient fault on attempt 2 (DIFFQ_FAULT_FAIL_ATTEMPTS=9)"
    assert get_queue("diffq", conn).count == 0


@pytest.mark.slow
@pytest.mark.long
def test_retry_failed_requeues_only_what_may_succeed_unless_all(env, conn, tmp_path, monkeypatch):
    enqueue(tmp_path, "prompt,adapter\nneeds an adapter,/nonexistent/dora\n", "--no-path-checks", "--max-retries", "0")
    for _ in range(2):  # missing on two workers: fails permanently
        assert run_worker(env).returncode == 0
    enqueue(tmp_path, "prompt\nflaky one\n", "--max-retries", "0")
    assert run_worker({**env, "DIFFQ_FAULT_FAIL_ATTEMPTS": "1"}).returncode == 0  # fails, may succeed later
    queue = get_queue("diffq", conn)
    assert FailedJobRegistry(queue=queue).count == 2
    first = producer("retry-failed")
    assert "re-queued 1 failed job(s)" in first.output
    assert "1 job(s) failed permanently and would fail again" in first.output
    assert queue.count == 1 and queue.get_jobs()[0].meta.get("permanent") is False
    wait = producer("wait", "--timeout", "1")
    assert wait.exit_code == 4  # one job is queued again, nobody runs it
    everything = producer("retry-failed", "--all")
    assert "re-queued 1 failed job(s)" in everything.output and queue.count == 2
