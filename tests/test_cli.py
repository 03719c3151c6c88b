"""What a user meets at the command line: progress that tells the truth, help that is whole,
flags checked once, and messages that say what to do."""

from __future__ import annotations

import json
import re
import signal

import pytest
import redis
from click.testing import CliRunner
from conftest import SLOW, TINY_FLAGS, kill, producer, run_worker, running_job, start_worker, wait_for, write_csv

from common.queues import get_queue, recent_key
from producer.cli import main as producer_main
from producer.progress import format_duration
from producer.status import QueueStatus, RunningJob, rates
from worker.cli import main as worker_main


def test_durations_read_as_durations_not_clock_times():
    assert [format_duration(s) for s in (0, 45, 1276, 10_920, 190_000)] == ["0s", "45s", "21m16s", "3h02m", "2d04h"]


def test_one_finished_job_gives_a_rate_and_parallel_workers_add_up():
    now = 1000.0
    assert rates([(b"dqa:8:10.0", now - 2.0)], now) == (1 / 12.0, 8 / 12.0)  # ran 10 s, ended 2 s ago
    two = [(b"dqa:8:10.0", now), (b"dqb:8:10.0", now)]  # two workers, side by side
    assert rates(two, now) == (2 / 10.0, 16 / 10.0)


def test_rates_from_a_sample_of_a_busy_window_match_the_whole_window():
    now = 10_000.0
    recent = [(f"dq{i}:8:5.0".encode(), now - 600 + i * 0.01) for i in range(60_000)]  # 100 jobs/s
    assert rates(recent[:5000], now, total=60_000) == pytest.approx(rates(recent, now))


def test_eta_counts_images_left_including_what_running_jobs_have_done():
    st = QueueStatus(queue="q", queued=2, running=1, images_enqueued=40, images_written=16, images_per_s=2.0)
    st.running_jobs = [RunningJob("dqx", "w", step=15, steps=30, images=8)]  # half of 8 images
    assert st.images_left == 40 - 16 - 4 and st.eta_s == 10.0


@pytest.mark.slow
@pytest.mark.long
def test_status_and_wait_show_the_whole_campaign_with_the_running_jobs_steps(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"campaign {i}\n" for i in range(4)))
    assert producer("enqueue", rows, *SLOW, "--chunk-size", "1", "--output", tmp_path / "out").exit_code == 0
    assert run_worker(env, "--max-jobs", "1").returncode == 0  # one job done before anyone watches
    worker = start_worker(env, tmp_path / "w.log", "--name", "W")
    try:
        wait_for(lambda: running_job(conn, "W"), 900, "the worker to be denoising")  # a hang, not a slow box
        data = json.loads(producer("status", "--json").output)
        assert data["images"]["enqueued"] == 4 and data["images"]["written"] == 1
        assert data["rate"]["images_per_s"] > 0  # right after the first job, not only after two
        assert data["running"][0]["step"] >= 2 and data["eta_s"] > 0
        text = producer("status").output
        assert re.search(r"images    1 of 4 written \((2[5-9]|[3-9]\d)\.\d% done", text) and "step " in text, text
        assert re.search(r"ETA \d+(s|m\d\ds|h\d\dm)\n", text), text
        waited = producer("wait", "--stall-timeout", "300")
        assert waited.exit_code == 0, waited.output
        assert "4/4 img written (100.0%)" in waited.output and "img/s" in waited.output, waited.output
        assert "jobs/s" in waited.output
        for line in waited.output.splitlines():  # a running job's steps are progress, never images
            if " 1 running" in line:
                written = re.search(r"(\d+)/4 img written \(\s*([\d.]+)%\)", line)
                assert written and int(written[1]) < 4 and float(written[2]) < 100, line
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(300)
    assert conn.zcard(recent_key("diffq")) == 4


def test_no_rate_and_no_eta_while_no_worker_can_move_the_campaign():
    st = QueueStatus(queue="q", queued=1, images_enqueued=8, images_per_s=0.12, details=True)
    assert st.stalled == "no live worker" and st.eta_s is None
    st.workers, st.paused = ["w1", "w2"], {"w1": ["disk full"], "w2": ["disk full", "read-only"]}
    assert st.stalled == "all workers paused: disk full; read-only" and st.eta_s is None
    st.paused.pop("w2")
    assert st.stalled is None and st.eta_s == 8 / 0.12
    done = QueueStatus(queue="q", images_enqueued=8, images_written=8, details=True)
    assert done.stalled is None and done.to_json()["images"]["left"] == 0.0
    assert isinstance(done.to_json()["images"]["left"], float)


def test_wait_gives_up_when_nothing_moves_and_says_why(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\nnobody takes this\n")
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    data = json.loads(producer("status", "--json").output)
    assert data["stalled"] == "no live worker" and data["eta_s"] is None and data["rate"]["images_per_s"] == 0
    waited = producer("wait", "--stall-timeout", "1", "--poll", "0.2")
    assert waited.exit_code == 4
    assert "error: queue 'diffq': nothing moved for 1s (no live worker); 1 job(s) left" in waited.output


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_dead_workers_leave_status_within_the_heartbeat_ttl(env, conn, tmp_path):
    env = {**env, "DIFFQ_HEARTBEAT_TTL": "6"}
    worker = start_worker(env, tmp_path / "w.log", "--name", "gone-soon")
    try:
        listed = lambda: "gone-soon" in json.loads(producer("status", "--json").output)["workers"]  # noqa: E731
        wait_for(listed, 600, "the worker to show")
        kill(worker)
        worker.wait(30)
        wait_for(lambda: not listed(), 60, "the dead worker to leave the list")  # RQ keeps its key for 60 s
    finally:
        kill(worker)


def test_help_is_whole_and_names_every_choice():
    top = CliRunner().invoke(producer_main, ["--help"]).output
    assert "..." not in top.split("Commands:")[1]  # no description cut short
    enqueue = CliRunner().invoke(producer_main, ["enqueue", "--help"]).output
    assert "flux-random" in enqueue and "for rows without a width cell" in enqueue
    worker_help = "".join(CliRunner().invoke(worker_main, ["run", "--help"]).output.split())  # click wraps at '-'
    assert "persistent-norms" in worker_help and "pixart:compile-blocks,compile-vae" in worker_help


def test_a_bad_flag_is_one_error_about_the_flag(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"row {i}\n" for i in range(50)))
    result = producer("enqueue", rows, *TINY_FLAGS, "--width", "1001")
    assert result.exit_code == 2
    assert result.output.strip() == "error: --width: width 1001 is not a multiple of 8"


def test_the_same_file_on_two_queues_makes_two_sets_of_jobs(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\nshared row\n")
    for queue in ("a", "b"):
        assert producer("enqueue", rows, *TINY_FLAGS, "--queue", queue, "--output", tmp_path).exit_code == 0
    a, b = get_queue("a", conn).job_ids, get_queue("b", conn).job_ids
    assert len(a) == len(b) == 1 and a != b


def test_a_redis_that_needs_a_password_says_so(tmp_path, redis_server):
    from conftest import RedisServer, free_port

    server = RedisServer(free_port(), tmp_path, extra=("--requirepass", "pw"), password="pw")
    server.start()
    try:
        result = producer("status", "--redis-url", server.url)
        assert result.exit_code == 2
        assert "needs a password: put it in the URL" in result.output
        assert redis.Redis(port=server.port, password="pw").ping()
    finally:
        server.stop()


def test_a_full_redis_stops_the_producer_with_one_line_and_whole_chunks(env, tmp_path, monkeypatch):
    from conftest import RedisServer, free_port

    server = RedisServer(free_port(), tmp_path, extra=("--maxmemory", "2mb", "--maxmemory-policy", "noeviction"))
    server.start()
    try:
        monkeypatch.setenv("REDIS_URL", server.url)
        rows = write_csv(
            tmp_path / "p.csv", "prompt\n" + "".join(f"a long prompt number {i} {'x' * 200}\n" for i in range(20000))
        )
        full = producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out")
        assert full.exit_code == 5
        assert full.output.strip().splitlines()[-1].startswith("error: Redis is full (its maxmemory)")
        conn = redis.Redis.from_url(server.url)
        queue = get_queue("diffq", conn)
        assert 0 < queue.count < 20000 // 8 + 1
        claimed = conn.hlen("diffq:diffq:items")
        assert claimed == sum(len(job.kwargs["spec"]["items"]) for job in queue.get_jobs())  # no half chunk
    finally:
        server.stop()
