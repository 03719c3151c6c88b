"""Fixtures: a real redis-server per test session, the tiny model built once, and helpers to
run the real CLIs (in-process for the producer, as subprocesses for workers)."""

from __future__ import annotations

import os

# OpenMP threads that wait for work sleep instead of spinning. On a loaded box a spinning
# libgomp thread burns the slice its peer needs: the in-process torch tests took 3-6x their
# CPU time at load 4 on 2 cores (the decode test 40.6 s, 13.6 s with this). Set before torch is
# imported here or in a worker the tests start (they inherit it); OMP_* from the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from lifeline import install_session_handlers, kept_signals, tie_children
from PIL import Image
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_server(proc: subprocess.Popen | None) -> None:
    """SIGTERM a server the tests started, and wait for it to go."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(10)


@dataclass
class RedisServer:
    port: int
    dir: Path
    proc: subprocess.Popen | None = None
    extra: tuple[str, ...] = ()
    password: str | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server not found on PATH: install it (apt-get install redis-server) — tests never skip this"
            )
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", ""]
        self.proc = subprocess.Popen([*args, *self.extra], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, password=self.password)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        pytest.fail(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        stop_server(self.proc)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"), extra=("--appendonly", "no"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    redis.Redis.from_url(redis_server.url).flushall()
    return redis_server.url


@pytest.fixture
def conn(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model and tiny-dora adapter, written once for the session by the real code."""
    from worker.pipelines.models import ensure_tiny, ensure_tiny_dora

    path = tmp_path_factory.mktemp("cache")
    ensure_tiny(path)
    ensure_tiny_dora(path)
    return path


@pytest.fixture
def plain(cache_dir: Path) -> Any:
    """A CPU worker's warm pipelines with no lever: the images a lever's must match."""
    from worker.pipelines.warm import WarmPipelines

    return WarmPipelines(str(cache_dir), device="cpu", speedups="none")


@pytest.fixture
def env(redis_url: str, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for CLIs: this test's Redis, the shared tiny cache, quiet and unbuffered."""
    values = {"REDIS_URL": redis_url, "DIFFQ_CACHE": str(cache_dir), "PYTHONUNBUFFERED": "1"}
    for name in ("DIFFQ_QUEUE", "DIFFQ_OUTPUT", "DIFFQ_MODEL", "DIFFQ_CHUNK_SIZE", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return {**os.environ, **values}


def producer(*args: str) -> Result:
    """Run the producer CLI in-process (fast) with the current environment."""
    from producer.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


TINY_FLAGS = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "3")


def pytest_configure(config: pytest.Config) -> None:
    """The session stops on SIGTERM and SIGHUP as on Ctrl-C, and what it starts dies with it
    (tests/lifeline.py)."""
    install_session_handlers()
    tie_children()


@pytest.fixture(autouse=True)
def _stop_signals_stay_pytests() -> Iterator[None]:
    """An in-process worker under test never takes pytest's Ctrl-C, nor leaves its handlers behind."""
    yield from kept_signals()


_running_test: list[pytest.Item] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _running_test[:] = [item]


def _worker_tier() -> None:
    """A test that starts a worker process is in the ``worker`` (or ``slow``) tier: ``make
    test-fast`` starts none, so it stays fast on a loaded machine."""
    item = _running_test[0] if _running_test else None
    if item is not None and not (item.get_closest_marker("worker") or item.get_closest_marker("slow")):
        raise AssertionError(f"{item.nodeid} starts a worker process: mark it @pytest.mark.worker")


def worker_cmd(*args: str) -> list[str]:
    if args and args[0] in ("run", "launch"):
        _worker_tier()
    # the shipped CLI, wrapped so a test can ask for a fault or a hold (tests/held_worker.py)
    return [sys.executable, str(ROOT / "tests" / "held_worker.py"), *args]


def run_worker(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``worker run --burst`` as a real process until the queue is empty."""
    return subprocess.run(
        worker_cmd("run", "--burst", "--device", "cpu", *args),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def interpreted(code: str, argument: object) -> list:
    """Run ``code`` in a child Python under Triton's interpreter (``TRITON_INTERPRET=1`` must be
    set before Triton is first imported, which this process has done) with ``argument`` as JSON
    in ``sys.argv[1]``; returns the JSON list its last line prints (the failures it found)."""
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argument)],
        env=os.environ | {"TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ranks(
    script: Path, *args: str, ranks: int = 2, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``script args`` as ``ranks`` processes under torchrun (one machine, one thread each), output captured."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    return subprocess.run(
        [*command, str(ROOT / "tests" / "tied.py"), str(script), *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"} if env is None else env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_csv(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def start_worker(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """Start ``worker run`` (not burst unless asked) as a real process logging to ``log``."""
    handle = open(log, "ab")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen(
        worker_cmd("run", "--device", "cpu", *args), env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT
    )


def drain(env: dict[str, str], log: Path, name: str = "DRAIN", timeout: float = 400) -> None:
    """A fresh burst worker until the queue is empty; it must exit 0."""
    worker = start_worker(env, log, "--burst", "--name", name)
    try:
        assert worker.wait(timeout) == 0, log.read_text()
    finally:
        kill(worker)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (a zombie counts: its parent has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")


def images_under(output: Path) -> list[Path]:
    """Every image file under ``output``, whatever its format (common/image_format.py)."""
    from common.image_format import of_file

    return sorted(p for p in output.rglob("*") if p.is_file() and of_file(p.name) is not None)


#: long enough per job (about 4 s on 2 CPU cores) that a signal lands mid-denoising
SLOW = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "60")


def running_job(conn: redis.Redis, worker: str, min_step: int = 2, queue: str = "diffq") -> Job | None:
    """The job ``worker`` is denoising (at least ``min_step`` steps in), if any."""
    for job_id in StartedJobRegistry(queue, connection=conn).get_job_ids(cleanup=False):
        job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        if job.worker_name == worker and (job.meta.get("step") or 0) >= min_step:
            return job
    return None


def assert_exactly_once(output: Path, expected: int) -> None:
    """``expected`` images, each one whole, no temp file left, one metadata line per image."""
    images = images_under(output)
    assert len(images) == expected
    for path in images:
        with Image.open(path) as image:
            image.load()  # a half-written PNG would fail here
    assert not [p for p in output.rglob("*") if p.name.endswith(".tmp")]
    assert not (output / ".diffq-tmp").exists()  # a finished dataset holds images and metadata only
    lines = (output / "metadata.jsonl").read_text().splitlines()
    files = [json.loads(line)["file_name"] for line in lines]
    assert sorted(files) == sorted(str(p.relative_to(output)) for p in images)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (stopped or not) and wait until it is gone: a worker blocked in RQ's
    BLMOVE keeps its connection until its process is reaped, and could still take a job that the
    next test enqueues."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait(60)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 4 MiB tmpfs, to fill up (CI runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.fail(f"mounting a 4 MiB tmpfs needs root (CI runs as root): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own with AOF on (fsync always), to be stopped and restarted."""
    server = RedisServer(free_port(), tmp_path / "redis-aof", extra=("--appendonly", "yes", "--appendfsync", "always"))
    server.dir.mkdir()
    server.start()
    yield server
    server.stop()


@dataclass
class S3Server:
    """moto's standalone S3-compatible server on a loopback port, with authentication on: an
    IAM user with a key is made at start, and any other key is refused (403)."""

    port: int
    proc: subprocess.Popen | None = None
    key: str = ""
    secret: str = ""
    #: the address it listens on (a bridge's gateway for containers: tests/compose)
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        # moto lets this many requests through unauthenticated: the three that make our user
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._answers, 60, "the S3 server (moto) to answer")
        iam = self.client("iam", key="setup", secret="setup")
        iam.create_user(UserName="diffq")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="diffq", PolicyName="all", PolicyDocument=json.dumps(policy))
        made = iam.create_access_key(UserName="diffq")["AccessKey"]
        self.key, self.secret = made["AccessKeyId"], made["SecretAccessKey"]

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail("the S3 server (python -m moto.server) exited at start")
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def client(self, service: str = "s3", *, key: str = "", secret: str = ""):
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=key or self.key,
            aws_secret_access_key=secret or self.secret,
        )

    def env(self) -> dict[str, str]:
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "DIFFQ_S3_ENDPOINT_URL": self.endpoint,
        }

    def stop(self) -> None:
        stop_server(self.proc)
        self.proc = None


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server(free_port())
    server.start()
    yield server
    server.stop()


_buckets = iter(range(10**6))


@pytest.fixture
def bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket of this test's own, and the S3 settings in this process's environment
    (for the in-process producer); returns the bucket's name."""
    name = f"diffq-test-{next(_buckets)}"
    s3_server.client().create_bucket(Bucket=name)
    for var, value in s3_server.env().items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return name


def s3_objects(server: S3Server, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object in ``bucket`` under ``prefix``, read back with boto3 (not the code under test)."""
    s3 = server.client()
    found: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found
