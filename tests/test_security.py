"""Nothing let in: no pickle, no paths from user text, credentials only in the URL and never
printed, TLS (rediss://) works. All against real redis-servers and real worker processes."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import redis
from conftest import TINY_FLAGS, RedisServer, free_port, images_under, producer, run_worker, wait_for, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer

from common.jobspec import JobSpec


class _Payload:
    """Unpickling this runs ``touch <marker>``: what an attacker with Redis access would try."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_job(conn: redis.Redis, marker: Path, job_id: str = "evil") -> bytes:
    data = zlib.compress(pickle.dumps(("worker.task.run_job", None, (_Payload(marker),), {})))
    conn.hset(
        f"rq:job:{job_id}",
        mapping={
            "data": data,
            "created_at": "2026-01-01T00:00:00.000000Z",
            "enqueued_at": "2026-01-01T00:00:00.000000Z",
            "origin": "diffq",
            "status": "queued",
            "description": "evil",
            "timeout": 60,
        },
    )
    conn.sadd("rq:queues", "rq:queue:diffq")
    conn.rpush("rq:queue:diffq", job_id)
    return data


@pytest.mark.slow
@pytest.mark.long
def test_a_pickle_payload_is_rejected_and_creates_nothing(env, conn, tmp_path):
    marker = tmp_path / "pwned"
    data = pickle_job(conn, marker)
    out = tmp_path / "out"
    ok = write_csv(tmp_path / "ok.csv", "prompt\na job after the evil one\n")
    assert producer("enqueue", ok, *TINY_FLAGS, "--output", out).exit_code == 0

    worker = run_worker(env)
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert not marker.exists()
    evil = Job.fetch("evil", connection=conn, serializer=JSONSerializer)
    assert evil.get_status() == "failed"
    assert evil.meta["error"].startswith("payload is not a diffq JSON job")
    assert len(images_under(out)) == 1  # the worker went on to the next job

    # the same bytes are live: unpickled, they do create the file
    check = subprocess.run(
        [sys.executable, "-c", "import pickle,sys,zlib; pickle.loads(zlib.decompress(sys.stdin.buffer.read()))"],
        input=data,
        cwd=Path(__file__).parent,
        capture_output=True,
    )
    assert check.returncode == 0, check.stderr
    assert marker.exists()


NAME = re.compile(r"images/[0-9a-f]{2}/[0-9a-f]{24}-\d+\.png")


@pytest.mark.slow
@pytest.mark.long
def test_output_names_never_come_from_user_text(env, conn, tmp_path):
    rows = (
        "id,prompt,negative_prompt\n"
        "../../escape,../../../escape-prompt,/etc/passwd\n"
        "/etc/passwd,/abs/path/prompt.png,..\\..\\windows\n"
        "'; DROP TABLE,%2e%2e%2f%2e%2e%2f,~/.ssh/id_rsa\n"
    )
    (tmp_path / "work").mkdir()
    path = write_csv(tmp_path / "work" / "p.csv", rows)
    out = tmp_path / "work" / "out"
    before = set(tmp_path.rglob("*"))
    assert producer("enqueue", path, *TINY_FLAGS, "--output", out).exit_code == 0
    assert run_worker(env).returncode == 0
    created = set(tmp_path.rglob("*")) - before
    files = sorted(str(p.relative_to(out)) for p in created if p.is_file())
    assert files == sorted([*(f for f in files if NAME.fullmatch(f)), "metadata.jsonl"])
    assert len(files) == 4
    assert all(p.is_relative_to(out) for p in created)


@pytest.mark.slow
@pytest.mark.long
def test_a_job_naming_a_path_outside_the_output_root_is_refused(env, conn, tmp_path):
    root = tmp_path / "allowed"
    elsewhere = tmp_path / "elsewhere"
    spec = JobSpec.from_dict(
        {
            "v": 1,
            "params": {"model": "tiny", "width": 64, "height": 64, "steps": 2},
            "output": str(root / ".." / "elsewhere"),
            "items": [{"prompt": "x", "seed": 1}],
        }
    )
    from common.queues import TASK_FUNC, get_queue

    get_queue("diffq", conn).enqueue(TASK_FUNC, spec=spec.to_dict(), job_id="outside")
    assert run_worker({**env, "DIFFQ_OUTPUT_ROOT": str(root)}).returncode == 0
    job = Job.fetch("outside", connection=conn, serializer=JSONSerializer)
    assert job.get_status() == "failed"
    assert "is outside DIFFQ_OUTPUT_ROOT" in job.meta["error"]
    assert not elsewhere.exists()


@pytest.fixture
def acl_redis(tmp_path: Path):
    """Redis with a password on the default user and an ACL user ``alice``."""
    server = RedisServer(
        free_port(),
        tmp_path,
        extra=("--requirepass", "t0p-s3cret-default", "--user", "alice", "on", ">al1ce-s3cret", "~*", "&*", "+@all"),
        password="t0p-s3cret-default",
    )
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
def test_credentials_work_from_the_url_and_are_never_printed(env, acl_redis, tmp_path, monkeypatch):
    url = f"redis://alice:al1ce-s3cret@127.0.0.1:{acl_redis.port}/0"
    monkeypatch.setenv("REDIS_URL", url)
    path = write_csv(tmp_path / "p.csv", "prompt\na\nb\n")
    outputs = [producer("enqueue", path, *TINY_FLAGS, "--output", tmp_path / "out")]
    worker = run_worker({**env, "REDIS_URL": url})
    assert worker.returncode == 0
    outputs += [producer("status"), producer("status", "--json"), producer("wait", "--timeout", "10")]
    texts = [r.output for r in outputs] + [worker.stdout, worker.stderr]
    assert all(r.exit_code == 0 for r in outputs), [r.output for r in outputs]
    assert len(images_under(tmp_path / "out")) == 2
    assert any("alice:***@" in t for t in texts)
    assert not any("al1ce-s3cret" in t for t in texts)

    wrong = producer("status", "--redis-url", f"redis://alice:wrong-pass@127.0.0.1:{acl_redis.port}/0")
    assert wrong.exit_code == 2
    assert "refused the credentials" in wrong.output and "wrong-pass" not in wrong.output
    assert "Traceback" not in wrong.output


@pytest.fixture
def tls_redis(tmp_path: Path):
    """Redis listening with TLS only, on a self-signed certificate made here with openssl."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)),
            *("--tls-auth-clients", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    wait_for(lambda: _pings(redis.Redis.from_url(url)), 10, "the TLS redis-server to answer")
    yield url
    proc.terminate()
    proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.mark.slow
@pytest.mark.long
def test_rediss_url_is_accepted_end_to_end(env, tls_redis, tmp_path, monkeypatch):
    monkeypatch.setenv("REDIS_URL", tls_redis)
    path = write_csv(tmp_path / "p.csv", "prompt\nover tls\n")
    enqueued = producer("enqueue", path, *TINY_FLAGS, "--output", tmp_path / "out")
    assert enqueued.exit_code == 0, enqueued.output
    assert run_worker({**env, "REDIS_URL": tls_redis}).returncode == 0
    assert len(images_under(tmp_path / "out")) == 1
    assert producer("status", "--json").output.count('"finished": 1') == 1
    plain = producer("status", "--redis-url", tls_redis.replace("rediss://", "redis://").split("?")[0])
    assert plain.exit_code == 2 and "cannot reach Redis" in plain.output
