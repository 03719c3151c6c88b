"""Exactly once, for real: racing producers, two copies of a job, a stalled worker that comes
back, and the fence that makes a worker which lost its job record nothing. Real producer and
worker processes against a real redis-server."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from conftest import (
    ROOT,
    SLOW,
    TINY_FLAGS,
    assert_exactly_once,
    images_under,
    kill,
    producer,
    run_worker,
    running_job,
    start_worker,
    wait_for,
    write_csv,
)
from rq.job import Job
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

from common.ledger import MAKE, REMAKE_IMAGES, Ledger
from common.naming import output_id
from common.queues import by_model_key, get_queue, images_key, intents_key, items_key
from common.settings import Settings
from producer.enqueue import EnqueueOptions, Enqueuer
from producer.reader import RowDefaults, read_rows


def rows_file(tmp_path, n: int, name: str = "p.csv"):
    return write_csv(tmp_path / name, "prompt\n" + "".join(f"race prompt {i}\n" for i in range(n)))


@pytest.mark.slow
def test_racing_producers_queue_every_item_once_and_report_honestly(env, conn, tmp_path):
    path = rows_file(tmp_path, 2000)
    cmd = [sys.executable, "-m", "producer", "enqueue", str(path), *TINY_FLAGS, "--output", str(tmp_path / "out")]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    new = [int(out.split(" new", 1)[0].rsplit("\n", 1)[-1]) for out in outs]
    queue = get_queue("diffq", conn)
    assert sum(new) == 2000, outs  # each producer says what it added; together, the file once
    assert len(queue.job_ids) == len(set(queue.job_ids)) == 250
    assert conn.hlen(items_key("diffq")) == 2000


def test_a_producer_that_loses_the_race_between_lookup_and_queue_adds_nothing(env, conn, tmp_path):
    path = rows_file(tmp_path, 40)
    options = EnqueueOptions.from_settings(Settings().with_(chunk_size=8), str(tmp_path / "out"))
    defaults = RowDefaults(model="tiny", width=64, height=64, steps=3)
    slow = Enqueuer(conn, "diffq", options)
    from common.naming import item_key

    batch = [(item_key(r.params, r.item), r) for r in read_rows(path, defaults)]
    fresh = slow.classify(batch)  # looks up: all 40 are new...
    assert len(fresh) == 40
    assert Enqueuer(conn, "diffq", options).enqueue(path, defaults).new_items == 40  # ...another queues them
    chunks = [(fresh[0][1].params, [(k, r.item) for k, r in fresh[i : i + 8]]) for i in range(0, 40, 8)]
    slow._queue(chunks)  # the slow one's CLAIM finds every item taken
    assert slow.report.new_items == 0 and slow.report.known_items == 40
    assert get_queue("diffq", conn).count == 5


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_two_copies_of_a_job_popped_at_once_record_once(env, conn, tmp_path):
    path = rows_file(tmp_path, 8)
    out = tmp_path / "out"
    assert producer("enqueue", path, *TINY_FLAGS, "--chunk-size", "4", "--output", out).exit_code == 0
    queue = get_queue("diffq", conn)
    for jid in list(queue.job_ids):
        conn.rpush(queue.key, jid)  # as a racing producer without the ledger's CLAIM would have
    workers = [start_worker(env, tmp_path / f"w{i}.log", "--burst", "--name", f"W{i}") for i in range(2)]
    assert [w.wait(240) for w in workers] == [0, 0]
    assert_exactly_once(out, 8)
    assert int(conn.get(images_key("diffq"))) == 8


def test_a_worker_that_lost_its_job_records_nothing(conn, tmp_path):
    """The fence itself: BEGIN and COMMIT refuse an execution that is not in the started registry."""
    ledger = Ledger(conn, "q")
    conn.hset(items_key("q"), "k1", "dqjob")
    assert ledger.begin(member="dqjob:stale", offset=0, keys=["k1"]) is None
    conn.zadd(ledger.started_key, {"dqjob:current": 9e9})
    begun = ledger.begin(member="dqjob:current", offset=123, keys=["k1"])
    assert begun is not None and begun[0].state == "dqjob" and begun[0].intent is None
    assert conn.hget(intents_key("q"), "k1") == b"123"
    assert (
        ledger.commit(member="dqjob:stale", images={"k1": 2}, recent_member="j:1", output="/out", model="tiny") is None
    )
    assert conn.hget(items_key("q"), "k1") == b"dqjob" and conn.get(images_key("q")) is None
    assert (
        ledger.commit(member="dqjob:current", images={"k1": 2}, recent_member="j:1", output="/out", model="tiny") == 2
    )
    again = ledger.commit(member="dqjob:current", images={"k1": 2}, recent_member="j:1", output="/out", model="tiny")
    assert again == 0  # counted once
    assert conn.hget(items_key("q"), "k1") == f"done:{output_id('/out')}".encode()
    assert conn.hget(intents_key("q"), "k1") is None


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_stalled_worker_past_the_ttl_comes_back_and_records_nothing(env, conn, tmp_path):
    env = {**env, "DIFFQ_HEARTBEAT_TTL": "6"}
    out = tmp_path / "out"
    assert producer("enqueue", rows_file(tmp_path, 8), *SLOW, "--chunk-size", "4", "--output", out).exit_code == 0
    a = start_worker(env, tmp_path / "a.log", "--name", "A")
    b = start_worker(env, tmp_path / "b.log", "--name", "B")
    try:
        victim = wait_for(lambda: running_job(conn, "A"), 120, "worker A to be denoising")
        a.send_signal(signal.SIGSTOP)  # a GC pause, a swapped-out host, a partition...
        finished = FinishedJobRegistry("diffq", connection=conn)
        wait_for(lambda: victim.id in finished.get_job_ids(), 180, "B to finish A's job", interval=0.5)
        a.send_signal(signal.SIGCONT)
        wait_for(lambda: "recorded nothing" in (tmp_path / "a.log").read_text(), 120, "A to give up its record")
        wait_for(lambda: finished.count == 2, 180, "both jobs to finish", interval=0.5)
        job = Job.fetch(victim.id, connection=conn, serializer=JSONSerializer)
        assert job.worker_name == "B" and job.get_status() == "finished"
        assert_exactly_once(out, 8)
        assert int(conn.get(images_key("diffq"))) == 8
        assert a.poll() is None, "the stalled worker must live on"
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                kill(proc)


@pytest.mark.slow
@pytest.mark.long
def test_counter_equals_files_after_a_rerun_of_a_done_file(env, conn, tmp_path):
    path = rows_file(tmp_path, 6)
    out = tmp_path / "out"
    args = ("enqueue", path, *TINY_FLAGS, "--chunk-size", "3", "--output", out)
    enqueued = producer(*args)
    assert "6 new" in enqueued.output, enqueued.output
    first = run_worker(env)
    assert first.returncode == 0 and len(images_under(out)) == 6, first.stderr[-3000:]
    images_under(out)[0].unlink()
    assert "1 new (1 done earlier but missing on disk)" in producer(*args).output
    assert run_worker(env).returncode == 0
    assert_exactly_once(out, 6)
    assert int(conn.get(images_key("diffq"))) == len(images_under(out)) == 6


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_job_longer_than_twice_the_heartbeat_ttl_runs_once(env, conn, tmp_path):
    """The keeper renews the heartbeat of a long job: the other worker never takes it over."""
    env = {**env, "DIFFQ_HEARTBEAT_TTL": "6", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "out"
    long_job = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "300")
    assert producer("enqueue", rows_file(tmp_path, 1), *long_job, "--output", out).exit_code == 0
    workers = [start_worker(env, tmp_path / f"w{i}.log", "--name", f"W{i}") for i in range(2)]
    try:
        finished = FinishedJobRegistry("diffq", connection=conn)
        wait_for(lambda: finished.count == 1, 600, "the long job to finish", interval=0.5)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(60) for proc in workers] == [0, 0]
    job = Job.fetch(finished.get_job_ids()[0], connection=conn, serializer=JSONSerializer)
    took = job.ended_at - job.started_at
    assert took.total_seconds() > 12, f"the job took {took}, not longer than 2 x 6 s: make it longer"
    assert job.meta["attempts"] == 1 and "abandoned" not in job.meta
    assert_exactly_once(out, 1)
    logs = [(tmp_path / f"w{i}.log").read_text() for i in range(2)]
    assert sum(f"job {job.id}:" in log for log in logs) == 1


def test_images_by_model_are_counted_with_the_totals_through_a_remake(conn):
    """The ledger's scripts count each model's images beside the campaign's totals: queued once,
    written once, and a done item queued again to remake its images leaves 'written' until made."""
    ledger = Ledger(conn, "q")
    for jid, model in (("a", "tiny"), ("b", "tiny-sd3")):
        taken = ledger.claim(
            job_id=jid, model=model, keys=[f"k{jid}"], redo=[MAKE], images=[2], job_fields=["status", "queued"]
        )
        assert taken == []
    conn.zadd(ledger.started_key, {"a:1": 9e9})
    assert ledger.commit(member="a:1", images={"ka": 2}, recent_member="a:2", output="/out", model="tiny") == 2
    counts = {k.decode(): int(v) for k, v in conn.hgetall(by_model_key("q")).items()}
    assert counts == {"tiny:enqueued": 2, "tiny:written": 2, "tiny-sd3:enqueued": 2}
    conn.hset(Job.key_for("a"), "status", "finished")
    assert (
        ledger.claim(
            job_id="a", model="tiny", keys=["ka"], redo=[REMAKE_IMAGES], images=[2], job_fields=["status", "queued"]
        )
        == []
    )
    assert conn.hget(by_model_key("q"), "tiny:written") == b"0" and conn.get(images_key("q")) == b"0"
    assert conn.hget(by_model_key("q"), "tiny:enqueued") == b"2"  # the same images, not new ones
