"""Re-running the producer on the same file after a partial run enqueues only what is neither
done nor queued, so a crashed campaign resumes by running the same command again."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_FLAGS, images_under, producer, run_worker, write_csv
from rq.registry import FinishedJobRegistry

from common.queues import get_queue, images_key

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts


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
