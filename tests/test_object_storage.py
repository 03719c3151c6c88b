"""Writing straight to object storage: real producer and worker processes, a real redis-server
and a real S3-compatible server (moto's standalone server, authentication on), read back with
boto3 rather than the code under test."""

from __future__ import annotations

import builtins
import contextlib
import json
import socket
import threading
from io import BytesIO

import pytest
from conftest import (
    SLOW,
    TINY_FLAGS,
    S3Server,
    free_port,
    kill,
    producer,
    run_worker,
    running_job,
    s3_objects,
    start_worker,
    wait_for,
    write_csv,
)
from PIL import Image
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

import worker.serving.task as task
from common.errors import OutputUnavailable
from common.jobspec import JobSpec
from common.ledger import Ledger
from common.queues import get_queue, images_key
from common.settings import Settings
from common.storage import Store
from producer.status import collect
from worker.output.destination import Bucket
from worker.output.objects import existing
from worker.serving.context import JobContext
from worker.serving.runtime import Runtime


def prompts(tmp_path, n: int, name: str = "p.csv"):
    return write_csv(tmp_path / name, "prompt\n" + "".join(f"an object-store prompt {i}\n" for i in range(n)))


def images_and_lines(server: S3Server, bucket: str, prefix: str = "out/") -> tuple[dict[str, bytes], list[dict]]:
    """The PNG objects, and every line of every metadata part (duplicates kept)."""
    objects = s3_objects(server, bucket, prefix)
    images = {k.removeprefix(prefix): v for k, v in objects.items() if k.endswith(".png")}
    lines = [
        json.loads(line)
        for key, body in objects.items()
        if key.startswith(f"{prefix}metadata/")
        for line in body.decode().splitlines()
    ]
    return images, lines


def assert_exactly_once_in_bucket(server: S3Server, bucket: str, expected: int) -> None:
    images, lines = images_and_lines(server, bucket)
    assert len(images) == expected
    for body in images.values():
        with Image.open(BytesIO(body)) as image:
            image.load()  # a partial object would fail here
    names = [line["file_name"] for line in lines]
    assert sorted(set(names)) == sorted(images)


@pytest.mark.worker
def test_a_run_to_s3_writes_every_image_once_and_a_rerun_adds_nothing(env, conn, tmp_path, s3_server, bucket):
    path = prompts(tmp_path, 6)
    url = f"s3://{bucket}/out"
    result = producer("enqueue", path, *TINY_FLAGS, "--output", url, "--chunk-size", "4")
    assert result.exit_code == 0, result.output
    assert f"images go to {url}" in result.output
    done = run_worker({**env, **s3_server.env()})
    assert done.returncode == 0, done.stdout + done.stderr

    assert_exactly_once_in_bucket(s3_server, bucket, 6)
    images, lines = images_and_lines(s3_server, bucket)
    assert len(lines) == 6  # nothing lost or repeated on the happy path
    record = lines[0]
    for column in ("prompt", "negative_prompt", "seed", "model", "adapter", "width", "height", "steps", "key"):
        assert column in record
    with Image.open(BytesIO(images[record["file_name"]])) as image:
        assert json.loads(image.text["diffq"])["prompt"] == record["prompt"]  # images carry their parameters
    assert int(conn.get(images_key("diffq"))) == 6
    assert not [k for k in s3_objects(s3_server, bucket, "") if ".diffq-probe" in k]

    again = producer("enqueue", path, *TINY_FLAGS, "--output", url, "--chunk-size", "4")
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines()[-1].startswith("0 new, 6 already queued or done")

    # done means recorded *and* in the bucket: a deleted image is made again, its line is not repeated
    s3_server.client().delete_object(Bucket=bucket, Key=f"out/{record['file_name']}")
    redo = producer("enqueue", path, *TINY_FLAGS, "--output", url, "--chunk-size", "4")
    assert "1 new (1 done earlier but missing on disk)" in redo.output, redo.output
    assert run_worker({**env, **s3_server.env()}).returncode == 0
    images, lines = images_and_lines(s3_server, bucket)
    assert len(images) == 6 and len(lines) == 6
    assert int(conn.get(images_key("diffq"))) == 6


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"bucket": "no-such-bucket-here"}, "the bucket does not exist"),
        ({"AWS_SECRET_ACCESS_KEY": "wrong"}, "access denied"),
        ({"AWS_ACCESS_KEY_ID": "AKIANOTAKEY"}, "access denied"),
        ({"DIFFQ_S3_ENDPOINT_URL": "http://127.0.0.1:9"}, "cannot reach http://127.0.0.1:9"),
    ],
    ids=["wrong-bucket", "wrong-secret", "unknown-key", "unreachable-endpoint"],
)
def test_the_producer_refuses_a_bad_s3_output_with_one_line(
    env, conn, tmp_path, s3_server, bucket, monkeypatch, change, says
):
    target = change.pop("bucket", bucket)
    for name, value in change.items():
        monkeypatch.setenv(name, value)
    result = producer("enqueue", prompts(tmp_path, 3), *TINY_FLAGS, "--output", f"s3://{target}/out")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error: --output: output 's3://") and says in lines[-1], result.output
    assert "Traceback" not in result.output
    assert get_queue("diffq", conn).count == 0 and conn.hlen("diffq:diffq:items") == 0


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_worker_killed_mid_job_on_s3_loses_nothing_and_repeats_nothing(env, conn, tmp_path, s3_server, bucket):
    url = f"s3://{bucket}/out"
    assert producer("enqueue", prompts(tmp_path, 8), *SLOW, "--output", url, "--chunk-size", "4").exit_code == 0
    worker_env = {**env, **s3_server.env(), "DIFFQ_HEARTBEAT_TTL": "6"}
    first = start_worker(worker_env, tmp_path / "first.log", "--name", "first")
    try:
        wait_for(lambda: running_job(conn, "first", min_step=5), 120, "the first worker to be mid-job")
        kill(first)
        done = run_worker(worker_env, "--name", "second")
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        kill(first)
    assert_exactly_once_in_bucket(s3_server, bucket, 8)
    assert int(conn.get(images_key("diffq"))) == 8
    assert FailedJobRegistry("diffq", connection=conn).count == 0
    exported = producer("export", url, "--to", tmp_path / "wds", "--format", "webdataset")
    assert exported.exit_code == 0 and "exported 8 image(s) as 8 sample(s)" in exported.output, exported.output


class Cuttable:
    """A TCP relay to the S3 server that can be cut (connections refused) and restored on the
    same port: an endpoint that goes away under a running worker and comes back."""

    def __init__(self, target: int) -> None:
        self.port = free_port()
        self.target = target
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.restore()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self.conns = []

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_worker_that_loses_the_endpoint_pauses_and_resumes_without_failing_jobs(
    env, conn, tmp_path, s3_server, bucket
):
    relay = Cuttable(s3_server.port)
    url = f"s3://{bucket}/out"
    assert producer("enqueue", prompts(tmp_path, 12), *SLOW, "--output", url, "--chunk-size", "2").exit_code == 0
    worker_env = {**env, **s3_server.env(), "DIFFQ_S3_ENDPOINT_URL": relay.endpoint}
    log = tmp_path / "worker.log"
    proc = start_worker(worker_env, log, "--name", "w3")
    try:
        wait_for(lambda: int(conn.get(images_key("diffq")) or 0) >= 2, 180, "the first job to be recorded")
        relay.cut()
        paused = wait_for(lambda: collect(conn, "diffq").paused.get("w3"), 600, "the worker to pause")
        assert "cannot reach" in paused[0], paused
        assert FailedJobRegistry("diffq", connection=conn).count == 0
        relay.restore()
        wait_for(lambda: int(conn.get(images_key("diffq")) or 0) == 12, 300, "the queue to drain after the cut")
    finally:
        kill(proc)
        relay.cut()
    text = log.read_text()
    assert "Traceback" not in text
    assert FailedJobRegistry("diffq", connection=conn).count == 0
    assert_exactly_once_in_bucket(s3_server, bucket, 12)


def test_an_execution_that_loses_its_job_while_writing_its_part_withdraws_it(
    env, conn, tmp_path, s3_server, bucket, monkeypatch
):
    """The narrow window: BEGIN passed, the part is PUT, and the job is taken away before COMMIT.
    COMMIT refuses (the real script), and the part is deleted from the real bucket."""
    url = f"s3://{bucket}/out"
    assert producer("enqueue", prompts(tmp_path, 2), *TINY_FLAGS, "--output", url).exit_code == 0
    job = Job.fetch(get_queue("diffq", conn).job_ids[0], connection=conn, serializer=JSONSerializer)
    execution = f"{job.id}:exec1"
    conn.zadd(job.started_job_registry.key, {execution: 9e9})
    chunk = JobSpec.from_dict(job.kwargs["spec"])
    bucket_out = Bucket(url, Store(url, s3_server.endpoint))
    plan = task._plan(conn, "diffq", chunk, bucket_out)
    records = [task._item_record(chunk, item, key, i) for key, item, i in plan.todo]
    real_commit = Ledger.commit

    def taken_away_then_commit(self, **kwargs):
        assert any(k.startswith("out/metadata/") for k in s3_objects(s3_server, bucket, "out/"))  # the part is there
        conn.zrem(job.started_job_registry.key, execution)  # its heartbeat expired meanwhile
        return real_commit(self, **kwargs)

    monkeypatch.setattr(Ledger, "commit", taken_away_then_commit)
    with pytest.raises(task.JobLost, match="withdrawn"):
        ctx = JobContext(Runtime(Settings.load(), pipelines=None), execution=execution)  # type: ignore[arg-type]
        task._record(task.Run(ctx, job, chunk, bucket_out, plan, task._Progress(None, 0)), records)
    assert not [k for k in s3_objects(s3_server, bucket, "out/") if k.startswith("out/metadata/")]
    assert conn.get(images_key("diffq")) is None  # nothing counted


def test_a_worker_without_s3fs_pauses_instead_of_failing_the_job(tmp_path, monkeypatch):
    """A worker's missing package is its environment: one line, a pause, no failed job."""
    real_import = builtins.__import__

    def no_s3fs(name, *args, **kwargs):
        if name == "s3fs":
            raise ImportError("No module named 's3fs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_s3fs)
    with pytest.raises(OutputUnavailable, match=r"needs s3fs: pip install 'diffq\[s3\]'"):
        existing(Store("s3://some-bucket/out"), ["images/ab/x-0.png"])
