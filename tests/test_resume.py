"""Re-running the producer on the same file after a partial run enqueues only what is neither
done nor queued, so a crashed campaign resumes by running the same command again."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest
from conftest import TINY_FLAGS, images_under, producer, run_worker, write_csv
from rq.registry import FinishedJobRegistry

from common.queues import get_queue, images_key
from worker.output.images import remove_stale_temps, temp_dir, write_atomic

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts


@pytest.mark.long
def test_rerun_after_a_partial_run_enqueues_only_what_is_missing(env, conn, tmp_path):
    path = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"resume prompt {i}\n" for i in range(8)))
    out = tmp_path / "out"
    args = ("enqueue", path, *TINY_FLAGS, "--chunk-size", "2", "--output", out)
    assert producer(*args).exit_code == 0

    # a partial run: one worker does 2 of the 4 jobs and stops
    assert run_worker(env, "--max-jobs", "2").returncode == 0
    assert len(images_under(out)) == 4
    queue = get_queue("diffq", conn)
    assert queue.count == 2

    # same command again: the 4 done and the 4 still queued are all skipped
    again = producer(*args)
    assert again.exit_code == 0
    assert "0 new, 8 already queued or done: enqueued 0 job(s)" in again.output

    # the queue is lost (flushed by hand, a Redis without persistence, ...) and one image deleted
    queue.empty()
    images_under(out)[0].unlink()
    resumed = producer(*args)
    assert resumed.exit_code == 0, resumed.output
    assert "5 new (1 done earlier but missing on disk), 3 already queued or done" in resumed.output

    assert run_worker(env).returncode == 0
    assert len(images_under(out)) == 8
    records = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    files = {r["file_name"] for r in records}
    assert files == {str(p.relative_to(out)) for p in images_under(out)}
    assert len(records) == 8  # the remade image keeps its one line: exactly one per image
    assert FinishedJobRegistry("diffq", connection=conn).count >= 5
    assert int(conn.get(images_key("diffq"))) == 8  # the counter equals the files, remade image included

    final = producer(*args)
    assert "0 new, 8 already queued or done" in final.output


def test_a_dead_writers_temp_file_is_removed_and_a_live_ones_kept(tmp_path):
    """Temp files live in ``.diffq-tmp``, not among the images: finding a dead writer's
    leftovers never lists an image folder of 40,000 files."""
    image = tmp_path / "images" / "ab" / "ab12-0.png"
    image.parent.mkdir(parents=True)
    temps = temp_dir(tmp_path)
    write_atomic(image, b"png", temps)
    assert image.read_bytes() == b"png" and list(temps.iterdir()) == []
    host = socket.gethostname().split(".")[0]
    gone = _dead_pid()
    dead = temps / f"ab12-0.png.{host}.{gone}.tmp"
    live = temps / f"ab12-0.png.{host}.{os.getpid()}.tmp"
    old = temps / "ab12-0.png.otherhost.1.tmp"
    for path in (dead, live, old):
        path.write_bytes(b"half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert remove_stale_temps(image, temps) == 2
    assert sorted(p.name for p in temps.iterdir()) == [live.name]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
