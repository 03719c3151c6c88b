"""The shipped image and compose file, built and run on a real Docker engine, as a user on a CPU
host runs them: ``compose.yaml`` with the ``compose.cpu.yaml`` override, ``--scale worker=2``.

Run by ``make test-compose`` (which starts the engine and builds the image first), never by
``make test``. Base images are the local CPU stand-ins of ``../shared/tools/container-engine.sh``;
no GPU ever meets a container here, so the GPU device reservation is parsed but never run.

The tests of this module run in order on one stack: each step of a user's first day, then the
faults (a worker SIGKILLed mid-job, Redis restarted mid-run), then ``docker compose stop``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, assert_exactly_once, free_port, wait_for

REDIS_PASSWORD = "compose-test-redis"
OWNER = 1234
DASHBOARD = ("diffq", "compose-test-dashboard")
#: a job of these runs a few seconds on a CPU: long enough to be caught mid-job
SLOW = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "60", "--chunk-size", "2")


@dataclass
class Stack:
    project: str
    env_file: Path
    data: Path

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file)]
        cmd += ["-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml"), *args]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    def producer(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.compose("run", "--rm", "-T", "producer", *args, timeout=timeout, check=check)

    def redis(self, *args: str) -> str:
        cli = ["exec", "-T", "redis", "redis-cli", "--no-auth-warning", "-a", REDIS_PASSWORD, *args]
        return self.compose(*cli).stdout

    def containers(self, service: str) -> list[str]:
        return self.compose("ps", "-q", service).stdout.split()

    def status(self) -> dict:
        return json.loads(self.producer("status", "--json").stdout)


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("compose")
    data = home / "data"  # not created: dockerd makes it root:root 755, as on a user's host
    (home / "machine-id").write_text("a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0\n")
    env_file = home / ".env"
    settings = {
        "REDIS_PASSWORD": REDIS_PASSWORD,
        "RQ_DASHBOARD_USERNAME": DASHBOARD[0],
        "RQ_DASHBOARD_PASSWORD": DASHBOARD[1],
        "DIFFQ_DATA": data,
        "DIFFQ_MODEL": "tiny",
        "DIFFQ_ENV_FILE": env_file,
        "DIFFQ_DASHBOARD_PORT": free_port(),
        "DIFFQ_MACHINE_ID": home / "machine-id",
        "DIFFQ_TORCH_INDEX_URL": "",
        "DIFFQ_HEARTBEAT_TTL": 15,
        "DIFFQ_UID": OWNER,  # the owner a user chose for the images (not the image's 1000)
        "DIFFQ_GID": OWNER,
    }
    env_file.write_text("".join(f"{name}={value}\n" for name, value in settings.items()))
    stack = Stack(f"diffq-test-{os.getpid()}", env_file, data)
    try:
        stack.compose("up", "-d", "--scale", "worker=2", timeout=900)
        yield stack
    finally:
        logs = stack.compose("logs", "--no-color", "worker", check=False).stdout
        (ROOT / "out").mkdir(exist_ok=True)
        (ROOT / "out" / "compose-workers.log").write_text(logs)
        stack.compose("--profile", "metrics", "down", "-v", "--timeout", "30", check=False)  # the profile's service too
        shutil.rmtree(home, ignore_errors=True)


def serving(stack: Stack, count: int) -> bool:
    logs = stack.compose("logs", "--no-color", "worker").stdout
    return logs.count("serving queue") >= count


def test_two_workers_hold_distinct_leases_and_run_as_the_user_chosen_in_env(stack: Stack):
    wait_for(lambda: serving(stack, 2), 600, "both workers to serve the queue", interval=2)
    leases = stack.redis("--scan", "--pattern", "diffq:gpu-lease:*").split()
    assert sorted(key.rsplit(":", 1)[1] for key in leases) == ["0", "1"]
    assert len({key.rsplit(":", 2)[1] for key in leases}) == 1  # one host: one scope
    for container in stack.containers("worker"):
        pid = docker("inspect", "-f", "{{.State.Pid}}", container).strip()  # the worker, as the host sees it
        status = Path(f"/proc/{pid}/status").read_text()
        uid = str(OWNER)
        assert next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:] == [uid] * 4
    logs = stack.compose("logs", "--no-color", "worker").stdout
    assert "gpu=lease INFO worker" not in logs and " gpu=cpu0 " in logs and " gpu=cpu1 " in logs  # CPU slots


def health(container: str) -> str:
    return docker("inspect", "-f", "{{.State.Health.Status}}", container).strip()


def test_workers_and_the_dashboard_turn_healthy_by_their_healthchecks(stack: Stack):
    """The worker's healthcheck is its heartbeat in Redis (`worker health`), the dashboard's its
    port; both run inside the real containers here."""
    containers = [*stack.containers("worker"), *stack.containers("dashboard")]
    assert len(containers) == 3
    wait_for(lambda: all(health(c) == "healthy" for c in containers), 600, "healthy workers and dashboard", interval=3)


def test_enqueue_and_wait_write_every_image_into_the_host_folder(stack: Stack):
    shutil.copy(ROOT / "examples" / "prompts.csv", stack.data / "prompts.csv")
    done = stack.producer("enqueue", "/data/prompts.csv", "--output", "/data/out", "--model", "tiny",
                          "--width", "64", "--height", "64", "--steps", "4")  # fmt: skip
    assert "13 image(s)" in done.stdout + done.stderr or "new" in done.stdout
    stack.producer("wait", "--timeout", "900", timeout=960)
    assert_exactly_once(stack.data / "out", 13)
    assert stack.data.stat().st_uid == OWNER  # the folder dockerd made for the mount, handed to DIFFQ_UID
    for png in (stack.data / "out").rglob("*.png"):
        assert png.stat().st_mode & 0o004, f"{png} is not readable by the host's users"
        assert (png.stat().st_uid, png.stat().st_gid) == (OWNER, OWNER)


def series(text: str, name: str) -> float:
    """The sum of a Prometheus series' samples in ``text`` (every label set)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(text)
    return sum(sample.value for family in families for sample in family.samples if sample.name == name)


def test_metrics_for_a_fleet_from_the_metrics_service_and_every_worker(stack: Stack):
    """The opt-in ``metrics`` service serves the queue's series on the host's 127.0.0.1; each
    worker serves its own on the compose network (port 9200), as Prometheus would scrape them."""
    stack.compose("--profile", "metrics", "up", "-d", "metrics", timeout=300)
    host, port = stack.compose("port", "metrics", "9182").stdout.strip().rsplit(":", 1)
    assert host == "127.0.0.1"

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            return None

    text = wait_for(scrape, 300, "the metrics service to answer", interval=1)
    assert series(text, "diffq_images_written") == 13 and series(text, "diffq_complete") == 1, text
    assert series(text, "diffq_workers") == 2
    written = 0.0
    for container in stack.containers("worker"):
        read = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9200/metrics').read().decode())"
        text = docker("exec", container, "python3", "-c", read)
        assert series(text, "diffq_worker_up") == 1, text
        written += series(text, "diffq_worker_images_written_total")
    assert written == 13  # every image by exactly one worker's count


def get(url: str, auth: tuple[str, str] | None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_dashboard_asks_for_credentials_on_localhost_only(stack: Stack):
    published = stack.compose("port", "dashboard", "9181").stdout.strip()
    host, port = published.rsplit(":", 1)
    assert host == "127.0.0.1"
    url = f"http://127.0.0.1:{port}/0/data/queues.json"

    def answers() -> bool:
        try:
            return get(url, None) == 401
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_for(answers, 300, "the dashboard to answer", interval=1)
    assert get(url, DASHBOARD) == 200


def running_container(stack: Stack) -> str | None:
    """The container id of a worker that is mid-job (worker names end in <host>-<pid>, and a
    container's host name is its short id)."""
    running = stack.status().get("running") or []
    for job in running:
        host = str(job.get("worker", "")).split("-")[-2:-1]
        for container in stack.containers("worker"):
            if host and container.startswith(host[0]) and (job.get("step") or 0) >= 2:
                return container
    return None


def test_a_worker_killed_mid_job_loses_nothing(stack: Stack):
    rows = "".join(f"killed mid-job {i}\n" for i in range(8))
    (stack.data / "kill.csv").write_text(f"prompt\n{rows}")
    stack.producer("enqueue", "/data/kill.csv", "--output", "/data/kill", *SLOW)
    victim = wait_for(lambda: running_container(stack), 300, "a worker mid-job", interval=1)
    docker("kill", "-s", "SIGKILL", victim)
    stack.producer("wait", "--timeout", "900", timeout=960)
    assert_exactly_once(stack.data / "kill", 8)
    stack.compose("up", "-d", "--scale", "worker=2")  # both again for the next steps
    wait_for(lambda: serving(stack, 3), 600, "the killed worker's replacement to serve", interval=2)


def test_a_redis_restart_mid_run_is_a_pause(stack: Stack):
    rows = "".join(f"redis restarted {i}\n" for i in range(8))
    (stack.data / "restart.csv").write_text(f"prompt\n{rows}")
    stack.producer("enqueue", "/data/restart.csv", "--output", "/data/restart", *SLOW)
    wait_for(lambda: running_container(stack), 300, "a worker mid-job", interval=1)
    stack.compose("restart", "redis")
    stack.producer("wait", "--timeout", "900", timeout=960)
    assert_exactly_once(stack.data / "restart", 8)
    assert stack.status()["jobs"].get("failed", 0) == 0


def test_compose_stop_is_a_warm_shutdown_inside_the_grace_period(stack: Stack):
    rows = "".join(f"stopped warm {i}\n" for i in range(4))
    (stack.data / "stop.csv").write_text(f"prompt\n{rows}")
    stack.producer("enqueue", "/data/stop.csv", "--output", "/data/stop", *SLOW)
    wait_for(lambda: running_container(stack), 300, "a worker mid-job", interval=1)
    workers = stack.containers("worker")
    started = time.monotonic()
    stack.compose("stop", "worker")
    took = time.monotonic() - started
    assert took < 300, f"docker compose stop took {took:.0f}s, past stop_grace_period (5m)"
    for container in workers:
        assert docker("inspect", "-f", "{{.State.ExitCode}}", container).strip() == "0"
    # the jobs that were running finished before their workers exited: their images are whole
    status = stack.status()
    assert not status.get("running") and status["jobs"].get("failed", 0) == 0
    # the dashboard (PID 1 in its container) stops on SIGTERM itself, not by SIGKILL after 10 s
    (dashboard,) = stack.containers("dashboard")
    started = time.monotonic()
    stack.compose("stop", "dashboard")
    assert time.monotonic() - started < 9 and docker("inspect", "-f", "{{.State.ExitCode}}", dashboard).strip() == "0"


def test_the_image_carries_nothing_that_never_runs_and_still_imports_what_does():
    """The size cut (Dockerfile): Triton's static CUPTI libraries and the test suites of sympy,
    networkx and numpy are gone; torch, Triton's profiler, Inductor and xfuser still import."""
    script = (
        "import glob, torch, triton, triton.profiler, torch._inductor.codecache, xfuser, numpy, sympy, networkx; "
        "print(len(glob.glob('/opt/diffq/**/cupti/*_static.a', recursive=True)), "
        "len(glob.glob('/opt/diffq/lib/*/site-packages/numpy/**/tests', recursive=True)))"
    )
    done = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python", "diffq:0.1.0", "-c", script],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0"], done.stdout
