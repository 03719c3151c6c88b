"""The boundary with RQ, owned. rq is pinned exactly (pyproject.toml, docker/constraints.txt).
diffq meets it through its public seams: the ``execution=`` arguments of RQ 3's completion
methods, ``prepare_execution``, ``get_heartbeat_ttl``, the registries and ``Job.key_for``.
What is left is listed here with its reason, checked against the installed rq, and RQ's own
worker runs a diffq job end to end, so an upgrade that changes any of it fails here first."""

from __future__ import annotations

import ast
import inspect
import re
import threading
import time
import tomllib

import pytest
import redis
import rq
from conftest import ROOT, TINY_FLAGS, producer, write_csv
from rq import SimpleWorker
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.results import Result
from rq.serializers import JSONSerializer

from common.lanes import LaneQueue
from common.ledger import CLAIM, Ledger
from common.queues import RETIRE_FINISHED, LeanJob, get_queue, items_key, retire_finished
from common.rq_keys import rq_names
from worker.group.leader import GroupWorker
from worker.serving.commands import POLL_S, STOP_S
from worker.serving.recovery import _UNSTICK
from worker.serving.rqworker import DiffqWorker

#: every RQ method diffq's worker classes override, and why RQ's own does not do
OVERRIDES = {
    "DiffqWorker._install_signal_handlers": "RQ's handlers raise in the main thread, which may sit in a "
    "CUDA call for seconds: a watcher thread hears signals at once and gives the job back (signals.py)",
    "DiffqWorker.get_heartbeat_ttl": "documented hook: a short TTL, so a dead worker's job is back in seconds",
    "DiffqWorker.prepare_execution": "remember the running job's execution (RQ 3 keeps several per worker, "
    "and the handed-off job's is one of them) and give the job its context, which names it",
    "DiffqWorker.execute_job": "RQ's, plus: Redis gone on the way out ends the process with its own status",
    "DiffqWorker.bootstrap": "RQ's, plus the keeper thread (heartbeats during a job, recovery, retries due)",
    "DiffqWorker.teardown": "RQ's, plus the writer's last job completed, every Redis call bounded",
    "DiffqWorker.subscribe": "RQ's, with the pubsub thread waiting on its socket half a second at a time, "
    "not 60 s: the way out waits for it",
    "DiffqWorker.unsubscribe": "RQ unsubscribes and then stops the thread, whose stop joins it without a "
    "bound since redis-py 8.2: a thread that had read the reply waited out 60 s, and so did the worker",
    "DiffqWorker.clean_registries": "diffq's recovery, which re-queues without using a retry, then RQ's "
    "maintenance without its clean-ups of started and intermediate jobs (they use a retry or fail the job)",
    "DiffqWorker.handle_exception": "one line per failure, not RQ's traceback per job; the failure handler",
    "DiffqWorker.handle_job_failure": "a worker's own environment (disk, model) gives the job back, no retry used",
    "DiffqWorker.handle_job_success": "a job whose tail the writer has is completed when the writer is done",
    "DiffqWorker.dequeue_job_and_maintain_ttl": "paused workers probe instead of taking jobs; --burst waits "
    "for retries due and jobs on other workers",
    "DiffqWorker.get_current_job_id": "the job denoising now: RQ 3 answers with any execution, and a job "
    "the writer saves keeps one; RQ's stop-job asks this before it stops anything",
    "DiffqWorker.kill_horse": "RQ's stop-job / stop-execution end here; with no work-horse, the job stops "
    "at its next denoising step, before any image is written",
    "GroupWorker.dequeue_job_and_maintain_ttl": "a rank asked to stop stops the group",
    "GroupWorker.handle_exception": "a lost rank is not the job's failure",
    "GroupWorker.handle_job_failure": "a lost rank gives the job back and ends the group",
    "GroupWorker.prepare_job_execution": "RQ takes a job out of the intermediate list only for a worker of one "
    "queue; a group takes its two lanes with LMOVE, so the job leaves that list as it starts",
    "LeanJob.to_dict": "leaves out empty fields: 10^6 queued jobs cost less Redis memory",
    "LaneQueue.dequeue_any": "RQ pops several queues with BLPOP, skipping the intermediate list a dead worker's "
    "job is found in; a group's lanes are taken one by one with LMOVE",
}
#: RQ's private names diffq still touches, and why
PRIVATE = {
    "_stop_requested": "RQ's work loop ends on it and RQ has no public setter (request_stop re-installs "
    "RQ's own signal handlers)",
    "_install_signal_handlers": "see OVERRIDES",
    "_pubsub_exception_handler": "RQ's retry of a pubsub connection that failed, kept for the thread subscribe starts",
    "_stopped_job_id": "RQ's stop-job handler sets it before calling kill_horse, and handle_job_failure reads "
    "it to end the job stopped; kill_horse reads which job to stop from it",
}
PRODUCT = ("common", "producer", "worker")


def shape(func) -> list[tuple[str, object, object]]:
    """Parameter names, kinds and defaults (annotations may be spelt differently)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def test_rq_is_pinned_to_the_installed_version_everywhere():
    assert rq.__version__.startswith("3.")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"rq=={rq.__version__}" in deps
    assert f"rq=={rq.__version__}" in (ROOT / "docker" / "constraints.txt").read_text().split()


def test_every_override_is_listed_with_its_reason_and_has_rqs_signature():
    found = {}
    for cls, base in ((DiffqWorker, SimpleWorker), (GroupWorker, SimpleWorker), (LeanJob, Job), (LaneQueue, Queue)):
        for name in vars(cls):
            member, upstream = getattr(cls, name), getattr(base, name, None)  # bound: classmethods too
            if callable(member) and callable(upstream) and not name.startswith("__"):
                found[f"{cls.__name__}.{name}"] = (member, upstream)
    assert set(found) == set(OVERRIDES), "an override was added or removed: list it in OVERRIDES with its reason"
    for name, (member, upstream) in found.items():
        assert shape(member) == shape(upstream), f"{name} differs from rq's"


def _rq_private_names() -> set[str]:
    worker = SimpleWorker([], connection=redis.Redis(), prepare_for_work=False)  # sends no command
    job = Job(id="x", connection=redis.Redis())
    names = set(dir(SimpleWorker)) | set(vars(worker)) | set(dir(Job)) | set(vars(job))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_product_code_touches_no_other_private_rq_name():
    rq_private = _rq_private_names()
    used: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in rq_private:
                    used.setdefault(node.attr, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    # diffq's own attributes that happen to share a name with one of rq's do not count
    own = {n for cls in (DiffqWorker, GroupWorker) for n in _assigned_in(cls)} - set(dir(SimpleWorker))
    unexplained = {name: where for name, where in used.items() if name not in PRIVATE and name not in own}
    assert not unexplained, unexplained


def test_no_attribute_of_diffqs_workers_clashes_with_one_of_an_rq_worker_instance(conn: redis.Redis):
    """Instance attributes too, not only the class's: diffq once kept a lock under the name RQ 3
    keeps its list of executions (``_executions``), and RQ's stop-job broke its pubsub thread.
    Every attribute an RQ worker instance has keeps RQ's type on diffq's workers."""
    queues = [get_queue("boundary", conn)]
    theirs = vars(SimpleWorker(queues, connection=conn, prepare_for_work=False))
    for cls, extra in ((DiffqWorker, {}), (GroupWorker, {"group": None})):
        ours = vars(cls(queues, connection=conn, prepare_for_work=False, **extra))
        clashes = {
            name: (type(value).__name__, type(ours[name]).__name__)
            for name, value in theirs.items()
            if value is not None and ours.get(name) is not None and type(ours[name]) is not type(value)
        }
        assert not clashes, f"{cls.__name__} redefines rq's instance attributes: {clashes}"


def test_a_workers_pubsub_thread_is_stopped_within_seconds_whatever_it_waits_on(redis_url: str):
    """CI, 2026-12-04: an idle worker exited 61 s after SIGTERM. RQ sends UNSUBSCRIBE, then stops
    its pubsub thread; a thread that read the reply first waits up to RQ's 60 s for a subscription,
    and redis-py 8.2's stop joins it. Here the thread is caught in that wait, and in its wait on
    the socket: each time the worker's way out is done within its bound and the thread has ended."""
    from common.queues import connect

    conn = connect(redis_url)
    for caught in ("waiting for a subscription", "waiting on its socket"):
        worker = DiffqWorker([get_queue("pubsub", conn)], connection=conn, name=f"pubsub-{len(caught)}")
        worker.subscribe()
        deadline = time.monotonic() + 30
        while not worker.pubsub.subscribed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.pubsub.subscribed
        if caught == "waiting for a subscription":
            worker.pubsub.unsubscribe()  # as RQ's way out does; the thread reads the reply
            while worker.pubsub.subscribed and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not worker.pubsub.subscribed
        time.sleep(0.1)  # the thread is back in its wait
        thread, began = worker.pubsub_thread, time.monotonic()
        stopping = threading.Thread(target=worker.unsubscribe, daemon=True)
        stopping.start()
        stopping.join(30)  # RQ's own way out took 60 s here
        took = time.monotonic() - began
        assert not stopping.is_alive(), f"{caught}: the way out still waits after {took:.1f} s"
        assert took <= STOP_S + 1.0, (caught, took)
        thread.join(POLL_S * 4)
        assert not thread.is_alive(), caught
    conn.close()


def _assigned_in(cls: type) -> set[str]:
    source = inspect.getsource(cls)
    return set(re.findall(r"self\.(_\w+)\s*(?::[^=]+)?=", source))


def test_rqs_work_loop_still_reads_the_private_names_listed():
    assert "self._stop_requested" in inspect.getsource(SimpleWorker.work)
    assert "self._install_signal_handlers()" in inspect.getsource(SimpleWorker.work)


def test_no_script_names_an_rq_key_or_status():
    for script in (CLAIM, _UNSTICK, RETIRE_FINISHED):
        assert "rq:" not in script
        for status in JobStatus:
            assert f"'{status.value}'" not in script and f'"{status.value}"' not in script, status


@pytest.mark.parametrize("status", [s.value for s in JobStatus])
def test_an_item_is_queued_again_only_when_its_job_has_ended(conn: redis.Redis, status: str):
    """Every status of the installed rq, the ones RQ 3 added among them: an item whose job is in
    any status but an ended one is taken, and a second CLAIM queues nothing."""
    conn.hset(items_key("b"), "item", "owner")
    conn.hset(Job.key_for("owner"), "status", status)
    taken = Ledger(conn, "b").claim(
        job_id="second",
        model="tiny",
        keys=["item"],
        redo=[0],
        images=[1],
        job_fields=["status", "queued"],
    )
    ended = status in {"finished", "failed", "stopped", "canceled"}
    assert (taken == []) == ended, (status, taken)
    assert rq_names().ended == {"finished", "failed", "stopped", "canceled"}


def test_retiring_finished_jobs_deletes_rqs_own_keys(conn: redis.Redis):
    queue = get_queue("retire", conn)
    jobs = [queue.enqueue("builtins.len", "ab") for _ in range(3)]
    SimpleWorker([queue], connection=conn, serializer=JSONSerializer).work(burst=True)
    assert all(conn.exists(Job.key_for(job.id)) and conn.exists(Result.get_key(job.id)) for job in jobs)
    assert retire_finished(conn, "retire", keep=1) == 2
    kept = [(bool(conn.exists(Job.key_for(j.id))), bool(conn.exists(Result.get_key(j.id)))) for j in jobs]
    assert sorted(kept) == [(False, False), (False, False), (True, True)]


def test_rqs_own_worker_runs_a_diffq_job(env, conn: redis.Redis, tmp_path):
    """RQ's SimpleWorker, not diffq's, takes a job the producer queued: the job function finds no
    diffq context, says so, and still writes and records its images."""
    rows = write_csv(tmp_path / "p.csv", "prompt\na lighthouse\na harbour\n")
    out = tmp_path / "out"
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", out).exit_code == 0
    queue = get_queue("diffq", conn)
    (job_id,) = queue.job_ids
    SimpleWorker([queue], connection=conn, serializer=JSONSerializer).work(burst=True)
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.FINISHED, job.latest_result()
    assert len(job.return_value()["files"]) == 2
    assert len(list((out / "images").rglob("*.png"))) == 2
    assert len((out / "metadata.jsonl").read_text().splitlines()) == 2
