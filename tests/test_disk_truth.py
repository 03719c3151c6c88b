"""The dataset on disk always equals the ledger: an append that hits a full disk leaves the
metadata as it was and costs no retry; a store that lost objects, or a deleted output folder, is
made whole again by the same enqueue, lines included; counts never run ahead of the disk.
Real worker processes, redis-server, moto's S3 server and a real tmpfs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    TINY_FLAGS,
    assert_exactly_once,
    kill,
    producer,
    run_worker,
    wait_for,
    write_csv,
)
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from common.errors import OutputUnavailable
from common.queues import get_queue, images_key, seen_key
from worker.output.images import locked_metadata

HELD = ROOT / "tests" / "held_worker.py"


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` to the last byte, then give back ``leave`` bytes (whole tmpfs pages)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    size = filler.stat().st_size
    os.truncate(filler, size - size % 4096 - leave)
    return filler


def records(n: int, start: int = 0) -> list[dict]:
    return [{"file_name": f"images/ab/{'ab' * 12}-{i}.png", "prompt": "x" * 500, "index": i} for i in range(start, n)]


def test_an_append_that_hits_a_full_disk_leaves_the_file_as_it_was(small_disk):
    out = small_disk / "out"
    out.mkdir()
    with locked_metadata(out) as meta:
        meta.append(records(2))
    before = (out / "metadata.jsonl").read_bytes()
    fill(small_disk, leave=4096)  # one page more: room for part of the ~9 KiB the next append writes
    with pytest.raises(OutputUnavailable, match="not writable on this worker"), locked_metadata(out) as meta:
        meta.append(records(20, start=2))
    assert (out / "metadata.jsonl").read_bytes() == before  # not 4096 bytes more, mid-line


def test_a_torn_last_line_is_cut_before_the_next_append(tmp_path):
    """A writer SIGKILLed mid-append left half a line: the next writer (under the lock, so
    nobody is writing it) removes it instead of leaving a fragment for good."""
    with locked_metadata(tmp_path) as meta:
        meta.append(records(2))
    whole = (tmp_path / "metadata.jsonl").read_bytes()
    with open(tmp_path / "metadata.jsonl", "ab") as handle:
        handle.write(b'{"file_name": "images/ab/torn')
    with locked_metadata(tmp_path) as meta:
        meta.append(records(3, start=2))
    lines = (tmp_path / "metadata.jsonl").read_bytes().splitlines()
    assert (tmp_path / "metadata.jsonl").read_bytes().startswith(whole)
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.long
def test_a_disk_that_fills_while_a_job_records_pauses_the_worker_and_costs_no_retry(env, conn, small_disk, tmp_path):
    out = small_disk / "out"
    text = "".join(f"a prompt with a long text {i} " * 4 + "\n" for i in range(8))
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + text)
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "8", "--output", out).exit_code == 0
    release, state = tmp_path / "release", tmp_path / "state"
    log = tmp_path / "w.log"
    extra = {"HELD_RECORD": str(release), "HELD_STATE": str(state)}
    with open(log, "ab") as handle:
        worker = subprocess.Popen(
            [sys.executable, str(HELD), "run", "--device", "cpu", "--name", "W"],
            env={**env, **extra}, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    queue = get_queue("diffq", conn)
    try:
        wait_for(lambda: state.exists() and state.read_text() == "recording", 300, "the job's images on disk")
        assert len(list(out.rglob("*.png"))) == 8
        filler = fill(small_disk, leave=4096)  # the 8 lines need ~5 KiB
        release.touch()
        wait_for(lambda: "paused, jobs stay queued" in log.read_text(errors="replace"), 300, "the worker to pause")
        assert not (out / "metadata.jsonl").exists() or (out / "metadata.jsonl").read_bytes() == b""
        assert FailedJobRegistry(queue=queue).count == 0
        assert [job.retries_left for job in queue.get_jobs()] == [3]  # given back, no retry spent
        assert int(conn.get(images_key("diffq")) or 0) == 0
        filler.unlink()
        finished = FinishedJobRegistry(queue=queue)
        wait_for(lambda: finished.count == 1, 300, "the job once space is back", interval=0.5)
        assert "Traceback" not in log.read_text(errors="replace")
        assert_exactly_once(out, 8)
        assert int(conn.get(images_key("diffq"))) == 8
    finally:
        release.touch()
        kill(worker)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_deleted_output_folder_is_made_again_with_its_lines(env, conn, tmp_path):
    out = tmp_path / "out"
    rows = write_csv(tmp_path / "p.csv", "prompt\nfolder a\nfolder b\n")
    args = ("enqueue", rows, *TINY_FLAGS, "--output", out)
    assert producer(*args).exit_code == 0
    assert run_worker(env).returncode == 0
    again = producer(*args)  # this host sees the folder now
    assert "0 new, 2 already queued or done" in again.output
    shutil.rmtree(out)
    redo = producer(*args)
    assert "2 new (2 done earlier but missing on disk)" in redo.output, redo.output
    assert f"output {out} is gone: its 2 done item(s) are made again" in redo.output
    assert int(conn.get(images_key("diffq"))) == 0  # what is gone is not counted as written
    assert run_worker(env).returncode == 0
    assert_exactly_once(out, 2)
    assert int(conn.get(images_key("diffq"))) == 2

    # a folder this host never saw may be another host's: said, not guessed
    conn.delete(seen_key("diffq"))
    shutil.rmtree(out)
    blind = producer(*args)
    assert "0 new, 2 already queued or done" in blind.output
    assert f"output {out} is not visible from this host: 2 done item(s) were not checked" in blind.output


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_bucket_that_lost_images_and_metadata_parts_gets_both_back(env, conn, tmp_path, s3_server, bucket):
    from test_object_storage import images_and_lines

    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"lost object {i}\n" for i in range(4)))
    url = f"s3://{bucket}/out"
    args = ("enqueue", rows, *TINY_FLAGS, "--output", url, "--chunk-size", "1")
    assert producer(*args).exit_code == 0
    assert run_worker({**env, **s3_server.env()}).returncode == 0
    s3 = s3_server.client()
    parts = {
        json.loads(body)["file_name"]: key
        for key, body in ((k, v) for k, v in s3_objects_of(s3_server, bucket).items() if "/metadata/" in k)
    }
    names = sorted(parts)
    for name in names[:2]:  # image and line gone (the server lost both)
        s3.delete_object(Bucket=bucket, Key=f"out/{name}")
        s3.delete_object(Bucket=bucket, Key=parts[name])
    s3.delete_object(Bucket=bucket, Key=f"out/{names[2]}")  # the image only: its line stays

    redo = producer(*args)
    assert "3 new (3 done earlier but missing on disk)" in redo.output, redo.output
    assert int(conn.get(images_key("diffq"))) == 1
    assert run_worker({**env, **s3_server.env()}).returncode == 0
    images, lines = images_and_lines(s3_server, bucket)
    assert sorted(images) == names
    assert sorted(line["file_name"] for line in lines) == names  # one line each: none lost, none twice
    assert int(conn.get(images_key("diffq"))) == 4


def s3_objects_of(server, bucket: str) -> dict[str, bytes]:
    from conftest import s3_objects

    return s3_objects(server, bucket, "out/")
