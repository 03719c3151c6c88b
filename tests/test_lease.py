"""GPU leases (worker/supervision/lease.py), the part of `compose up --scale worker=N` that runs outside
Docker: real worker processes against a real Redis never hold the same GPU, extra replicas
wait, and a SIGKILLed holder's GPU is taken over once its lease expires."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import RedisServer, free_port, start_worker, wait_for
from rq import Worker

from common.errors import ConfigError
from worker.serving.signals import EXIT_LEASE_LOST
from worker.supervision.lease import LEASE_TTL_S, GpuLease, candidates, lease_key

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts


def holders(conn) -> dict[str, str]:
    return {k.decode().rsplit(":", 1)[1]: conn.get(k).decode() for k in conn.keys("diffq:gpu-lease:testhost:*")}


def test_candidates():
    assert candidates("0,1,3") == ["0", "1", "3"]
    assert candidates("all", count_gpus=2) == ["0", "1"]
    for bad in ("0,0", "a", ""):
        with pytest.raises(ConfigError, match="--gpu-lease"):
            candidates(bad)
    with pytest.raises(ConfigError, match="nvidia-smi lists no GPU"):
        candidates("all", count_gpus=0)


def test_leases_are_scoped_by_slurms_node_name_unless_one_is_given(monkeypatch):
    from common.settings import Settings
    from worker.supervision.lease import lease_scope

    monkeypatch.delenv("DIFFQ_LEASE_SCOPE", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    assert Settings.load().lease_scope == ""  # then /etc/machine-id, else the hostname
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-07")
    assert lease_scope(Settings.load().lease_scope) == "gpu-node-07"
    monkeypatch.setenv("DIFFQ_LEASE_SCOPE", "rack2")
    assert Settings.load().lease_scope == "rack2"


def test_a_lease_is_exclusive_renewable_and_released(conn):
    first = GpuLease(conn, "h", ["0", "1"])
    second = GpuLease(conn, "h", ["0", "1"])
    assert (first.try_acquire(), second.try_acquire(), GpuLease(conn, "h", ["0", "1"]).try_acquire()) == (
        "0",
        "1",
        None,
    )
    assert 0 < conn.ttl(lease_key("h", "0")) <= LEASE_TTL_S
    assert first.renew()
    conn.set(lease_key("h", "1"), "someone else")
    assert not second.renew()  # taken over: the worker stops after its job
    first.release()
    assert conn.get(lease_key("h", "0")) is None


@pytest.mark.long
def test_a_cpu_worker_leases_a_slot_and_is_named_and_logged_cpu_not_gpu(conn, monkeypatch, capfd):
    """A newcomer's CPU replicas (compose.cpu.yaml) were named ``diffq-gpu0-…`` and logged
    "leased GPU 0": a CPU worker now leases the same index as a CPU slot and is ``cpu<N>``."""
    from common.settings import Settings
    from worker.cli import _lease_gpu
    from worker.serving.runtime import worker_name

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    url = conn.connection_pool.connection_kwargs
    redis_url = f"redis://{url['host']}:{url['port']}/0"
    settings = Settings(redis_url=redis_url, gpu_lease="0,1", lease_scope="h", device="cpu")
    leased, lease = _lease_gpu(settings)  # logs to stderr, as a worker process does
    try:
        said = capfd.readouterr().err
        assert leased.gpu_label == "cpu0" and worker_name(leased.gpu_label).startswith("diffq-cpu0-")
        assert "leased CPU slot 0 of host h" in said and "GPU" not in said
        gpu, second = _lease_gpu(settings.with_(device="auto"))  # a GPU host's worker: as before
        assert gpu.gpu_label == "1" and worker_name(gpu.gpu_label).startswith("diffq-gpu1-")
        second.release()
    finally:
        lease.release()


def test_a_lease_is_held_while_the_worker_starts_however_long_that_takes(env, conn, tmp_path):
    """Between taking its lease and serving, a worker imports torch and loads its model; four
    replicas starting on a loaded two-core host took longer than the lease lives (CI, compose),
    and the leases lapsed before any worker renewed them: a waiting replica could take a GPU in
    use. Here the model load is held for two lease lifetimes (a lease renewed every second, so a
    loaded machine's scheduling has five seconds of room)."""
    ttl = 6
    release, state = tmp_path / "release", tmp_path / "state"
    extra = {"DIFFQ_LEASE_SCOPE": "testhost", "DIFFQ_GPU_LEASE": "0", "HELD_LEASE_TTL": str(ttl),
             "HELD_LOAD": str(release), "HELD_STATE": str(state)}  # fmt: skip
    log = tmp_path / "w.log"
    proc = start_worker({**env, **extra}, log, "--preload", "tiny", "--name", "slow-start")
    try:
        wait_for(lambda: state.exists(), 240, "the worker to reach its model load")
        owner = holders(conn)["0"]
        assert f":{proc.pid}:" in owner
        assert f"{ttl}s, renewed while alive" in log.read_text()  # the lifetime HELD_LEASE_TTL set
        rival = GpuLease(conn, "testhost", ["0"])
        held_since = time.monotonic()
        while time.monotonic() - held_since < 2 * ttl:  # a lapse at any moment would show here
            assert rival.try_acquire() is None, log.read_text()
            time.sleep(0.1)
        release.touch()
        wait_for(lambda: conn.exists("rq:worker:slow-start"), 240, "the worker to serve")
        assert holders(conn) == {"0": owner}

        conn.set(lease_key("testhost", "0"), "another host's worker", ex=60)  # taken over
        assert proc.wait(240) == EXIT_LEASE_LOST, log.read_text()
        assert "GPU lease 0 was taken by another worker" in log.read_text()
        assert holders(conn) == {"0": "another host's worker"}  # not released: it was not ours
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)


@pytest.mark.long
def test_a_signal_stops_a_starting_leasing_worker_while_redis_is_down(env, tmp_path):
    """The lease is renewed from the moment it is taken, so a worker still loading its model
    talks to Redis: with Redis gone, one SIGTERM must still end it within the stop promise
    (tests/test_stop.py: 30 s with Redis down), without a traceback. Its lease lapses in Redis."""
    server = RedisServer(free_port(), tmp_path / "redis")
    server.dir.mkdir()
    server.start()
    release, state = tmp_path / "release", tmp_path / "state"
    extra = {"REDIS_URL": server.url, "DIFFQ_LEASE_SCOPE": "testhost", "DIFFQ_GPU_LEASE": "0",
             "HELD_LOAD": str(release), "HELD_STATE": str(state)}  # fmt: skip
    log = tmp_path / "w.log"
    proc = start_worker({**env, **extra}, log, "--preload", "tiny", "--name", "starting")
    try:
        wait_for(lambda: state.exists(), 240, "the worker to reach its model load")
        server.stop()
        wait_for(lambda: "Redis unreachable" in log.read_text(), 60, "the lease's renewal to miss Redis")
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(120)
        took = time.monotonic() - signalled
        print(f"exit {code} {took:.1f} s after SIGTERM")
        text = log.read_text()
        assert took < 40, text
        assert code == 128 + signal.SIGTERM, text
        assert "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        server.stop()


@pytest.mark.long
@pytest.mark.soak
def test_scaled_workers_get_distinct_gpus_and_a_dead_holders_gpu_is_freed(env, conn, tmp_path):
    env = {**env, "DIFFQ_LEASE_SCOPE": "testhost", "DIFFQ_GPU_LEASE": "0,1"}
    procs = [start_worker(env, tmp_path / f"w{i}.log") for i in range(3)]
    try:
        leased = wait_for(lambda: len(holders(conn)) == 2 and holders(conn), 600, "two leases")
        time.sleep(2.5)  # the third worker keeps waiting: it must not take a held GPU
        assert len(holders(conn)) == 2
        names = wait_for(
            lambda: len(Worker.all(connection=conn)) == 2 and Worker.all(connection=conn), 240, "2 workers"
        )
        assert sorted(n.name.split("-")[1] for n in names) == ["cpu0", "cpu1"]
        logs = [(tmp_path / f"w{i}.log").read_text() for i in range(3)]
        waiting = [i for i, log in enumerate(logs) if "are leased; waiting" in log]
        assert len(waiting) == 1

        victim = next(i for i in range(3) if i not in waiting and f":{procs[i].pid}:" in leased["0"])
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: f":{procs[waiting[0]].pid}:" in (holders(conn).get("0") or ""),
            LEASE_TTL_S + 30,
            "the waiting worker to take GPU 0",
        )
        print(f"GPU 0 taken over {time.monotonic() - killed:.1f}s after its holder was killed")
        assert f":{procs[3 - victim - waiting[0]].pid}:" in holders(conn)["1"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
    assert holders(conn) == {}  # a stopped worker releases its lease
