"""``worker health``, compose's healthcheck for a worker: the heartbeat the worker keeps in Redis,
not whether its process exists; and the placeholder passwords of .env.example refused in one line."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, kill, start_worker, wait_for

from common.errors import ConfigError
from common.settings import Settings


def health(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker", "health"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.worker
@pytest.mark.long
def test_worker_health_follows_the_heartbeat_of_a_worker_on_this_host(env, tmp_path):
    idle = health(env)
    assert idle.returncode == 1
    assert idle.stderr.strip() == (
        f"worker health: no worker on {socket.gethostname()} has renewed its heartbeat in 30s"
    )
    worker = start_worker(env, tmp_path / "w.log", "--name", "diffq-gpu0-health")
    try:
        wait_for(lambda: health(env).returncode == 0, 240, "worker health to pass")
        assert "diffq-gpu0-health alive" in health(env).stdout
        worker.send_signal(signal.SIGSTOP)  # hung: the process lives, the heartbeat stops
        wait_for(lambda: health(env).returncode == 1, 240, "worker health to fail on a stopped worker")
    finally:
        worker.send_signal(signal.SIGCONT)
        kill(worker)


def test_worker_health_without_redis_is_one_line_and_exit_1(env, monkeypatch):
    down = {**env, "REDIS_URL": "redis://127.0.0.1:1/0"}
    done = health(down)
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_env_examples_redis_placeholder_is_refused(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://:change-me-redis@redis:6379/0")
    with pytest.raises(ConfigError, match=r"REDIS_PASSWORD .* is still .env.example's placeholder"):
        Settings.load()
    monkeypatch.setenv("REDIS_URL", "redis://:a-real-password@redis:6379/0")
    Settings.load()
