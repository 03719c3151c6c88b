"""What keeps a 10^7-image campaign inside one Redis, at a small scale: at most --max-queued jobs
queued, finished jobs retired past --keep-finished (counted, not kept), a checked file not
checked again; and the exactly-once guarantees still hold through all of it (real redis-server,
real producer and worker processes). bench/campaign_scale.py runs the same at 10^7."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, TINY_FLAGS, assert_exactly_once, kill, producer, run_worker, wait_for, write_csv
from rq.registry import FinishedJobRegistry

from common.queues import get_queue, images_key
from common.settings import Settings
from producer.enqueue import EnqueueOptions, Enqueuer
from producer.reader import RowDefaults
from producer.status import collect


def prompts(tmp_path, n: int, name: str = "p.csv"):
    return write_csv(tmp_path / name, "prompt\n" + "".join(f"a scale prompt {i}\n" for i in range(n)))


def test_enqueue_keeps_at_most_max_queued_jobs_and_waits_for_room(conn, tmp_path):
    path = prompts(tmp_path, 40)
    options = EnqueueOptions.from_settings(Settings().with_(chunk_size=2, max_queued=3), str(tmp_path / "out"))
    enqueuer = Enqueuer(conn, "diffq", options)
    seen: list[int] = []
    enqueuer.on_wait = seen.append
    enqueuer.sleep = lambda s: time.sleep(0.01)
    queue = get_queue("diffq", conn)
    thread = threading.Thread(target=enqueuer.enqueue, args=(path, RowDefaults(model="tiny")), daemon=True)
    thread.start()
    taken = 0
    while thread.is_alive() or queue.count:
        wait_for(lambda: queue.count >= 3 or not thread.is_alive(), 30, "the producer to fill the queue to its limit")
        assert queue.count <= 3
        if conn.lpop(queue.key):  # a worker takes one
            taken += 1
    thread.join(30)
    assert taken == 20 and enqueuer.report.jobs == 20 and enqueuer.report.new_items == 40
    assert seen and max(seen) == 3  # it waited, and never with more than 3 queued


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_campaign_killed_while_waiting_for_room_resumes_with_every_image_once(env, conn, tmp_path):
    path = prompts(tmp_path, 24)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "producer", "enqueue", str(path), *TINY_FLAGS, "--output", str(out),
           "--chunk-size", "2", "--max-queued", "2"]  # fmt: skip
    first = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: get_queue("diffq", conn).count == 2, 60, "the producer to wait with 2 jobs queued")
        time.sleep(0.5)
        assert get_queue("diffq", conn).count == 2  # still waiting, not past its limit
    finally:
        kill(first)
    second = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for _ in range(30):  # a --burst worker leaves when it finds the queue empty; the producer may refill it
            done = run_worker(env)
            assert done.returncode == 0, done.stderr
            if second.poll() is not None and not get_queue("diffq", conn).count:
                break
        said, _ = second.communicate(timeout=60)
    finally:
        kill(second)
    assert second.returncode == 0
    assert said.strip().splitlines()[-1].startswith("20 new, 4 already queued or done"), said
    assert_exactly_once(out, 24)
    assert int(conn.get(images_key("diffq"))) == 24


@pytest.mark.slow
@pytest.mark.long
def test_finished_jobs_past_keep_finished_are_deleted_and_counted(env, conn, tmp_path):
    path = prompts(tmp_path, 10)
    out = tmp_path / "out"
    assert producer("enqueue", path, *TINY_FLAGS, "--output", out, "--chunk-size", "2").exit_code == 0
    assert run_worker(env, "--keep-finished", "2").returncode == 0
    registry = FinishedJobRegistry("diffq", connection=conn)
    assert registry.count == 2
    assert len(conn.keys("rq:job:*")) == 2 and len(conn.keys("rq:results:*")) == 2  # the other 3 are gone
    st = collect(conn, "diffq")
    assert (st.finished, st.images_written, st.images_enqueued) == (5, 10, 10)
    again = producer("enqueue", path, *TINY_FLAGS, "--output", out, "--chunk-size", "2")
    assert again.output.strip().splitlines()[-1].startswith("0 new, 10 already queued or done")  # the ledger knows
    assert_exactly_once(out, 10)


def test_a_file_checked_once_is_not_checked_again_unless_it_changed(env, conn, tmp_path):
    path = prompts(tmp_path, 5)
    args = (*TINY_FLAGS, "--output", tmp_path / "out")
    first = producer("enqueue", path, *args)
    assert first.exit_code == 0 and "checked before" not in first.output
    again = producer("enqueue", path, *args)
    assert again.exit_code == 0 and "checked before (same content, same flags)" in again.output
    other_flags = producer("enqueue", path, *args, "--steps", "4")
    assert "checked before" not in other_flags.output
    with open(path, "a", encoding="utf-8") as f:
        f.write("a,row,with too many fields\n")
    changed = producer("enqueue", path, *args)
    assert changed.exit_code == 2 and "nothing was enqueued" in changed.output
