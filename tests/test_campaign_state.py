"""What a second outside fault kit found (issue 78): reading never changes a campaign, a campaign
is complete only when its file is, and every tool says so the same way.

Real worker processes and the shipped producer as processes, a real redis-server, the tiny
model. Faults are caught in states the test can see (a hold's state file, a job's step, an
execution's expiry), never on the clock.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis
from conftest import (
    ROOT,
    SLOW,
    RedisServer,
    assert_exactly_once,
    drain,
    free_port,
    kill,
    producer,
    running_job,
    start_worker,
    wait_for,
    worker_cmd,
)
from rq.job import Job
from rq.serializers import JSONSerializer

from common.naming import output_id
from common.reconcile import left

TTL = "6"  # the shortest heartbeat TTL settings allow
FLAGS = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "30")


def prompts(tmp_path: Path, n: int, tag: str) -> Path:
    rows = tmp_path / f"{tag}.csv"
    rows.write_text("prompt\n" + "".join(f"{tag} prompt {i}\n" for i in range(n)), encoding="utf-8")
    return rows


def cli(env: dict[str, str], *args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The shipped producer as a process of its own (its exit code is what a script sees)."""
    cmd = [sys.executable, "-c", "from producer.cli import main; main()", *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def status(env: dict[str, str]) -> dict:
    done = cli(env, "status", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


class Keys:
    """Every key of a Redis as its content (not ``DUMP``'s bytes: a hash or set that grew past
    its compact encoding is serialised in its table's order, which Redis's incremental rehashing
    changes when nothing was written), with its time to live when it has one."""

    def __init__(self, conn: redis.Redis) -> None:
        self.at = time.monotonic()
        self.values: dict[bytes, tuple[object, int]] = {}
        for key in conn.scan_iter(count=1000):
            self.values[key] = (content(conn, key), conn.pttl(key))

    def changed_by(self, later: Keys) -> list[str]:
        """What differs, but keys whose own TTL ran out in between (a dead worker's key)."""
        elapsed_ms = (later.at - self.at) * 1000 + 2000
        differs = [k for k, (v, _) in later.values.items() if self.values.get(k, (None, 0))[0] != v]
        gone = [k for k, (_, ttl) in self.values.items() if k not in later.values and not 0 < ttl <= elapsed_ms]
        return sorted(k.decode(errors="replace") for k in differs + gone)


def content(conn: redis.Redis, key: bytes) -> object:
    """What ``key`` holds, the same whenever it holds the same."""
    kind = conn.type(key).decode()
    read = {
        "string": lambda: conn.get(key),
        "hash": lambda: sorted(conn.hgetall(key).items()),
        "set": lambda: sorted(conn.smembers(key)),
        "zset": lambda: conn.zrange(key, 0, -1, withscores=True),
        "list": lambda: conn.lrange(key, 0, -1),
        "stream": lambda: conn.xrange(key),
    }
    return kind, read[kind]() if kind in read else conn.dump(key)


def dashboard_pages(env: dict[str, str], queue: str, job_id: str) -> list[str]:
    """``producer dashboard``'s data pages and /metrics, each fetched once; their URLs."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer", "dashboard", "--port", str(port)],
        env={**env, "RQ_DASHBOARD_PASSWORD": "s3cret"}, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    pages = [f"{root}/0/data/queues.json", f"{root}/0/data/workers.json", f"{root}/metrics"]
    pages += [f"{root}/0/data/jobs/{queue}/{r}/8/asc/1.json" for r in ("queued", "started", "failed", "scheduled")]
    pages += [f"{root}/0/data/job/{job_id}.json", f"{root}/0/view/job/{job_id}"]
    auth = "Basic " + base64.b64encode(b"diffq:s3cret").decode()

    def fetch(url: str) -> bool:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": auth}), timeout=10):
                return True
        except (urllib.error.URLError, ConnectionError):
            return False

    try:
        wait_for(lambda: fetch(pages[0]), 120, "the dashboard to answer")
        for page in pages:
            assert fetch(page), page
    finally:
        proc.terminate()
        proc.wait(30)
    return pages


@pytest.mark.worker
def test_reading_tools_change_no_key_and_a_dead_workers_job_keeps_its_retries(env, conn, tmp_path):
    """Finding 1: ``producer status`` ran RQ's clean-up of the started registry, which took a
    dead worker's job to the retry backoff with one retry less (four kills and statuses later:
    failed, AbandonedJobError). Now status, wait, verify, metrics, export and the dashboard leave
    every key as it was, and the job comes back whole, by a worker, with its retries."""
    env = {**env, "DIFFQ_HEARTBEAT_TTL": TTL}
    out = tmp_path / "out"
    rows = prompts(tmp_path, 2, "dead")
    assert producer("enqueue", rows, *FLAGS, "--chunk-size", "2", "--max-retries", "3", "--output", out).exit_code == 0
    held, state = tmp_path / "never", tmp_path / "state"
    worker = start_worker({**env, "HELD_STEP": str(held), "HELD_STATE": str(state)}, tmp_path / "w.log")
    try:
        wait_for(lambda: state.exists() and state.read_text() == "denoising", 300, "the worker mid-job")
    finally:
        worker.send_signal(signal.SIGKILL)
        kill(worker)
    wait_for(lambda: left(conn, "diffq", ttl=int(TTL)).lost == 1, 60, "its execution to expire")
    (job_id,) = left(conn, "diffq", ttl=int(TTL)).lost_ids
    before = Keys(conn)
    reads = {
        "status": cli(env, "status"),
        "status --json": cli(env, "status", "--json"),
        "wait": cli(env, "wait", "--timeout", "2"),
        "verify": cli(env, "verify", out),
        "export": cli(env, "export", out, "--format", "parquet", "--to", tmp_path / "export", "--queue", "diffq"),
    }
    assert reads["wait"].returncode == 4, reads["wait"].stderr  # not done: the job is lost, not over
    from prometheus_client import generate_latest

    from producer.metrics import registry_for

    assert b'diffq_jobs{queue="diffq",state="lost"} 1.0' in generate_latest(registry_for(conn, ttl=int(TTL)))
    dashboard_pages(env, "diffq", job_id)
    for _ in range(4):  # the finding's four rounds: each status call spent a retry
        cli(env, "status")
    after = Keys(conn)
    assert before.changed_by(after) == [], {name: done.stderr[-300:] for name, done in reads.items()}
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert job.get_status() == "started" and job.retries_left == 3  # as its worker left it
    drain({**env}, tmp_path / "drain.log")
    assert_exactly_once(out, 2)
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert job.get_status() == "finished" and job.retries_left == 3 and job.meta["abandoned"] == 1
    assert status(env)["complete"] is True


def test_a_worker_whose_key_expired_stays_registered_whatever_reads_the_workers(env, conn, tmp_path):
    """Found by CI on a loaded machine: a killed worker's hash expired between two looks, and the
    next status call removed it from ``rq:workers`` (RQ's ``Worker.all`` runs SREM on an expired
    worker). Every tool that lists workers (status, wait, the healthcheck, the dashboard's
    pages, the reconciler) now only leaves it out; a worker's maintenance prunes it."""
    from rq import Worker

    from common.heartbeats import seen_workers

    rows = prompts(tmp_path, 1, "expired")
    assert producer("enqueue", rows, *FLAGS, "--output", tmp_path / "out").exit_code == 0
    gone = Worker(["diffq"], name="gone", connection=conn)
    gone.register_birth()
    conn.pexpire(gone.key, 1)
    wait_for(lambda: not conn.exists(gone.key), 30, "the worker's key to expire")
    before = Keys(conn)
    assert before.values[b"rq:workers"] and gone.key.encode() in conn.smembers("rq:workers")
    assert seen_workers(conn, "diffq") == [] and left(conn, "diffq", ttl=int(TTL)).pending == 1
    for args in (("status",), ("status", "--json"), ("wait", "--timeout", "1")):
        cli(env, *args)
    health = subprocess.run(worker_cmd("health"), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert health.returncode == 1 and "no worker" in health.stderr, health.stderr
    (job_id,) = (jid.decode() for jid in conn.lrange("rq:queue:diffq", 0, -1))
    dashboard_pages(env, "diffq", job_id)
    assert before.changed_by(Keys(conn)) == []
    assert conn.smembers("rq:workers") == {gone.key.encode()} == conn.smembers("rq:workers:diffq")


@pytest.mark.worker
@pytest.mark.long
def test_a_campaign_is_not_complete_while_its_producer_reads_the_file_nor_after_it_stopped_mid_file(
    env, conn, tmp_path
):
    """Finding 2: a producer topping the queue up (``--max-queued``) was paused; the jobs queued
    so far finished and wait said drained, status complete, the burst worker left. Now the
    enqueue is in Redis: while it runs a burst worker waits for it, once it is silent for a
    heartbeat TTL every tool says it stopped mid-file, and the campaign is complete only
    after the rest of the file is in."""
    env = {**env, "DIFFQ_HEARTBEAT_TTL": TTL}
    out = tmp_path / "out"
    rows = prompts(tmp_path, 12, "slowfile")
    flags = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "2", "--chunk-size", "1")
    cmd = [sys.executable, "-m", "producer", "enqueue", str(rows), *flags, "--max-queued", "2", "--output", str(out)]
    enqueue = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: left(conn, "diffq", ttl=int(TTL)).queued == 2, 120, "two jobs queued, the rest waiting")
        enqueue.send_signal(signal.SIGSTOP)  # a producer paused, slow or on a host that went away
        st = status(env)
        assert st["complete"] is False and len(st.get("enqueues", [])) == 1, st  # alive, or silent a TTL already
        worker = start_worker(env, tmp_path / "burst.log", "--burst", "--name", "BURST")
        # it makes the two images and leaves once the enqueue has been silent for a TTL
        assert worker.wait(300) == 0, (tmp_path / "burst.log").read_text()
        st = status(env)
        assert st["images"]["written"] == 2 and st["complete"] is False, st  # f5553bb: complete, 2 of 12
        assert [e["alive"] for e in st["enqueues"]] == [False] and "run it again" in st["enqueues"][0]["text"]
        said = cli(env, "wait", "--timeout", "60")
        assert said.returncode == 1 and "stopped at row" in said.stderr and "drained" not in said.stdout, said
        verify = cli(env, "verify", out)
        assert verify.returncode == 0 and "not finished" in verify.stdout and "stopped at row" in verify.stdout
        enqueue.send_signal(signal.SIGCONT)  # it comes back: it beats again and tops the queue up
        drain(env, tmp_path / "drain.log")  # it waits for the enqueue while it still runs
        assert enqueue.wait(120) == 0, enqueue.stdout.read() if enqueue.stdout else ""
    finally:
        enqueue.send_signal(signal.SIGCONT)
        kill(enqueue)
    assert_exactly_once(out, 12)
    st = status(env)
    assert st["complete"] is True and st["enqueues"] == [], st
    assert cli(env, "wait", "--timeout", "60").returncode == 0


@pytest.mark.worker
@pytest.mark.long
def test_a_job_cancelled_while_its_stalled_worker_held_it_and_written_later_leaves_a_complete_campaign(
    env, conn, tmp_path
):
    """Finding 3: a stalled worker's taken job was cancelled with the queued ones; the worker came
    back and wrote its image, the same enqueue queued the other three: 4/4 images, wait and verify
    0, but status said complete false (``cancelled 1``) for ever. One definition now: a cancelled
    job whose items were made later is no missing image."""
    out = tmp_path / "out"
    rows = prompts(tmp_path, 4, "cancelled")
    flags = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "2", "--chunk-size", "1")
    assert producer("enqueue", rows, *flags, "--output", out).exit_code == 0
    release, state = tmp_path / "release", tmp_path / "state"
    worker = start_worker({**env, "HELD_TAKEN": str(release), "HELD_STATE": str(state)}, tmp_path / "w.log")
    try:
        wait_for(lambda: state.exists() and state.read_text() == "taken", 300, "the worker holding a job it took")
        worker.send_signal(signal.SIGSTOP)
        assert cli(env, "cancel").returncode == 0
        release.touch()
        worker.send_signal(signal.SIGCONT)  # it comes back and runs the job it held
        wait_for(lambda: len(list(out.rglob("*.png"))) == 1, 300, "the stalled worker's image")
        assert producer("enqueue", rows, *flags, "--output", out).exit_code == 0  # the same enqueue resumes
        wait_for(lambda: status(env)["images"]["written"] == 4, 300, "the other three images")
        assert status(env)["jobs"]["cancelled"] >= 1  # RQ's canceled registry still names the job
    finally:
        kill(worker)
    assert_exactly_once(out, 4)
    assert status(env)["complete"] is True
    assert cli(env, "wait", "--timeout", "60").returncode == 0
    verify = cli(env, "verify", out)
    assert verify.returncode == 0 and "not finished" not in verify.stdout, verify.stdout


@pytest.mark.worker
@pytest.mark.long
def test_a_job_left_by_a_worker_stopped_with_redis_down_drains_at_once_after_a_status_call(env, aof_redis, tmp_path):
    """Finding 4: a busy worker stopped with Redis down left its job to come back by heartbeat; a
    status call's RQ clean-up moved it to the retry backoff, and the drain waited 372.7 s for it.
    Now status leaves it; the drain worker re-queues it at once, retries untouched."""
    env = {**env, "REDIS_URL": aof_redis.url, "DIFFQ_HEARTBEAT_TTL": TTL}
    conn = redis.Redis.from_url(aof_redis.url)
    out = tmp_path / "out"
    rows = prompts(tmp_path, 2, "redisdown")
    enqueued = cli(env, "enqueue", rows, *FLAGS, "--chunk-size", "2", "--max-retries", "3", "--output", out)
    assert enqueued.returncode == 0, enqueued.stderr
    held, state = tmp_path / "never", tmp_path / "state"
    worker = start_worker({**env, "HELD_STEP": str(held), "HELD_STATE": str(state)}, tmp_path / "w.log")
    try:
        wait_for(lambda: state.exists() and state.read_text() == "denoising", 300, "the worker mid-job")
        aof_redis.stop()
        worker.send_signal(signal.SIGTERM)
        held.touch()  # the job goes on, and finds no Redis to record in
        assert worker.wait(120) != 0  # Redis down: it leaves its job to its heartbeat
    finally:
        kill(worker)
    aof_redis.start()
    conn = redis.Redis.from_url(aof_redis.url)
    wait_for(lambda: left(conn, "diffq", ttl=int(TTL)).lost == 1, 60, "its execution to expire")
    (job_id,) = left(conn, "diffq", ttl=int(TTL)).lost_ids
    assert cli(env, "status").returncode == 0
    started = time.monotonic()
    drain(env, tmp_path / "drain.log")
    took = time.monotonic() - started
    assert "a retry is scheduled" not in (tmp_path / "drain.log").read_text()
    assert took < 120, f"the drain took {took:.0f}s"
    assert_exactly_once(out, 2)
    assert Job.fetch(job_id, connection=conn, serializer=JSONSerializer).retries_left == 3


@pytest.mark.worker
@pytest.mark.long
def test_sighup_is_a_warm_stop_for_a_worker_and_for_worker_launch(env, conn, tmp_path):
    """Finding 5: closing a worker's terminal killed it like SIGKILL (exit 129 in 0.26 s, its job
    left to the heartbeat). SIGHUP is a warm stop now, for a worker and for ``worker launch``:
    the running job finishes, exit 0."""
    out = tmp_path / "out"
    assert producer("enqueue", prompts(tmp_path, 1, "hangup"), *FLAGS, "--output", out).exit_code == 0
    held, state = tmp_path / "release", tmp_path / "state"
    worker = start_worker({**env, "HELD_STEP": str(held), "HELD_STATE": str(state)}, tmp_path / "w.log")
    try:
        wait_for(lambda: state.exists() and state.read_text() == "denoising", 300, "the worker mid-job")
        worker.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP" in (tmp_path / "w.log").read_text(), 60, "the worker to hear SIGHUP")
        held.touch()
        assert worker.wait(300) == 0, (tmp_path / "w.log").read_text()[-3000:]
    finally:
        kill(worker)
    assert_exactly_once(out, 1)
    # worker launch: its workers get SIGTERM from it, and finish their jobs
    out = tmp_path / "launched"
    assert producer("enqueue", prompts(tmp_path, 1, "launched"), *SLOW, "--output", out).exit_code == 0
    log = tmp_path / "l.log"
    with open(log, "wb") as handle:
        launched = subprocess.Popen(worker_cmd("launch", "--gpus", "cpu"), env=env, cwd=ROOT, stdout=handle,
                                    stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: running_job(conn, worker_of(conn), min_step=1), 300, "the launched worker mid-job", 0.05)
        launched.send_signal(signal.SIGHUP)
        assert launched.wait(300) == 0, log.read_text()[-3000:]
    finally:
        kill(launched)
    assert_exactly_once(out, 1)
    assert "SIGHUP: warm" in log.read_text()


def worker_of(conn: redis.Redis) -> str:
    """The name of the one live worker (``worker launch`` names its own)."""
    names = [w.decode().removeprefix("rq:worker:") for w in conn.smembers("rq:workers")]
    return names[0] if names else "?"


def test_redis_at_its_connection_limit_or_a_replica_is_said_as_such_not_as_down(env, tmp_path, monkeypatch):
    """Finding 6: at ``maxclients`` status and enqueue said "cannot reach Redis … start
    redis-server" while Redis was up and answering "max number of clients reached"."""
    full = RedisServer(free_port(), tmp_path / "full")
    full.dir.mkdir()
    full.start()
    replica = None
    try:
        holder = redis.Redis(port=full.port)
        holder.config_set("maxclients", 1)  # this client holds the one place: no room for another
        monkeypatch.setenv("REDIS_URL", full.url)
        for args in (("status",), ("enqueue", prompts(tmp_path, 1, "full"), "--model", "tiny")):
            said = producer(*args)
            assert said.exit_code != 0 and "max number of clients reached" in said.output, said.output
            assert "start redis-server" not in said.output and "Traceback" not in said.output
        holder.config_set("maxclients", 100)
        holder.close()
        replica = RedisServer(free_port(), tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(full.port)))
        replica.dir.mkdir()
        replica.start()
        monkeypatch.setenv("REDIS_URL", replica.url)
        said = producer("enqueue", prompts(tmp_path, 1, "replica"), "--model", "tiny", "--output", tmp_path / "o")
        assert said.exit_code != 0 and "read-only replica" in said.output, said.output
        assert "Traceback" not in said.output
    finally:
        full.stop()
        if replica is not None:
            replica.stop()


def test_an_enqueue_for_a_new_output_of_a_campaign_says_so_and_names_the_flag(env, conn, tmp_path):
    """Finding 7: docs/slurm.md's first try enqueued README's file for another output on the
    default queue and got ``enqueued 0 job(s)``, then a line about an output "not visible from
    this host". Now the rows done for another output are named as such with the flag that makes
    them, and a queue of its own makes them."""
    from common.ledger import Ledger

    rows = prompts(tmp_path, 3, "first")
    first, second = tmp_path / "first", tmp_path / "try" / "out"
    assert producer("enqueue", rows, "--model", "tiny", "--output", first).exit_code == 0
    ledger = Ledger(conn, "diffq")
    items = {key.decode(): 1 for key in conn.hkeys(ledger.items_key)}
    conn.hset(ledger.items_key, mapping={key: f"done:{output_id(str(first))}" for key in items})  # as workers record
    said = producer("enqueue", rows, "--model", "tiny", "--output", second)
    assert said.exit_code != 0, said.output
    assert "3 row(s) are done on queue 'diffq' for another output" in said.output and "--queue" in said.output
    assert "not visible from this host" not in said.output
    made = producer("enqueue", rows, "--model", "tiny", "--output", second, "--queue", "try")
    assert made.exit_code == 0 and "3 new" in made.output, made.output
