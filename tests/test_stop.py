"""Stop means stop: the matrix of a worker's state × Redis up or down × one or two signals.

Each cell is a real worker process caught in one state (idle, loading its model, denoising,
with a job's images in the writer, paused for a full disk), each on a queue of its own, then
SIGTERM once or twice, with Redis up or killed first. Every cell asserts how long the worker
took to exit and with what status; afterwards Redis is back, the queues are drained, and every
image exists once with one metadata line.

The bounds are the promise plus room for a loaded 2-core box: one signal with Redis up lets the
running job finish (idle and paused workers go at once); one signal with Redis down exits within
30 s (20 s of grace, then the job comes back by its heartbeat, as after a SIGKILL); a second
signal exits within 2 s of it in any state (1.5 s by the clock in the worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from conftest import (
    ROOT,
    SLOW,
    TINY_FLAGS,
    RedisServer,
    assert_exactly_once,
    free_port,
    producer,
    running_job,
    wait_for,
    worker_cmd,
)

from common.queues import paused_key

pytestmark = pytest.mark.slow
HELD = ROOT / "tests" / "held_worker.py"
STATES = ("idle", "loading", "denoising", "writing", "paused")
#: the worker's state (worker/serving/states.py) a second signal finds in each cell: a model loads
#: inside its first job; a job's tail in the writer leaves the main thread waiting for the next
#: job; a worker that was waiting (idle, writing) or paused may already be done (the first signal
#: ended its loop, and teardown waits for the writer)
DRAWN = {
    "idle": ("waiting", "done"),
    "loading": ("running",),
    "denoising": ("running",),
    "writing": ("waiting", "done"),
    "paused": ("paused", "done"),
}
#: seconds from the (last) signal to the exit, by (redis up, signals): the promise plus slack
LIMIT_S = {(True, 2): 5.0, (False, 2): 5.0, (False, 1): 40.0}


@dataclass
class Cell:
    state: str
    proc: subprocess.Popen
    log: Path
    out: Path
    images: int
    exited_after: float | None = None


def start(state: str, env: dict[str, str], tmp: Path, disk: Path) -> Cell:
    out = (disk if state == "paused" else tmp) / f"out-{state}"
    rows = tmp / f"{state}.csv"
    rows.write_text(f"prompt\nstopped while {state} a\nstopped while {state} b\n", encoding="utf-8")
    flags = SLOW if state == "denoising" else TINY_FLAGS
    if state != "idle":
        done = producer("enqueue", rows, *flags, "--chunk-size", "2", "--queue", state, "--output", out)
        assert done.exit_code == 0, done.output
    if state == "paused":  # the disk fills after the enqueue checked it
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(b"\0" * free)
    extra = {
        "HELD_STATE": str(tmp / f"{state}.state"),
        "HELD_LOAD": str(tmp / "release") if state == "loading" else "",
        "HELD_WRITER": str(tmp / "release") if state == "writing" else "",
    }
    log = tmp / f"{state}.log"
    cmd = [sys.executable, str(HELD), "run", "--device", "cpu", "--queue", state, "--name", f"stop-{state}"]
    proc = subprocess.Popen(cmd, env={**env, **extra}, cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
    return Cell(state, proc, log, out, 0 if state == "idle" else 2)


def reached(cell: Cell, conn: redis.Redis, tmp: Path) -> bool:
    if cell.state == "idle":
        return bool(conn.exists(f"rq:worker:stop-{cell.state}"))
    if cell.state in ("loading", "writing"):
        marker = tmp / f"{cell.state}.state"
        return marker.exists() and marker.read_text() == cell.state
    if cell.state == "denoising":
        return running_job(conn, "stop-denoising", queue="denoising") is not None
    return bool(conn.hget(paused_key("paused"), "stop-paused"))


def wait_exit(cells: list[Cell], since: float, limit: float) -> None:
    deadline = since + limit
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in cells):
        for cell in cells:
            if cell.exited_after is None and cell.proc.poll() is not None:
                cell.exited_after = time.monotonic() - since
        time.sleep(0.05)
    for cell in cells:
        if cell.exited_after is None and cell.proc.poll() is not None:
            cell.exited_after = time.monotonic() - since
        if cell.proc.poll() is None:
            cell.proc.kill()
            cell.proc.wait(30)


@pytest.mark.parametrize(
    ("redis_up", "signals"),
    [  # make test-long (CI runs it): make test has the parts' own stop tests (tests/test_parts.py),
        # the cold stop's give-back and its exit timer while Redis hangs among them
        pytest.param(True, 1, id="redis-up-one-signal", marks=pytest.mark.long),
        pytest.param(True, 2, id="redis-up-two-signals", marks=pytest.mark.long),
        pytest.param(False, 1, id="redis-down-one-signal", marks=pytest.mark.long),
        pytest.param(False, 2, id="redis-down-two-signals", marks=pytest.mark.long),
    ],
)
def test_every_state_stops_in_time_and_every_image_is_made_once(env, tmp_path, small_disk, redis_up, signals):
    server = RedisServer(free_port(), tmp_path / "redis", extra=("--appendonly", "yes", "--appendfsync", "always"))
    server.dir.mkdir()
    server.start()
    try:
        run_matrix(env, server, tmp_path, small_disk, redis_up, signals)
    finally:
        server.stop()


def run_matrix(env: dict[str, str], server: RedisServer, tmp_path: Path, small_disk: Path, redis_up: bool,
               signals: int) -> None:  # fmt: skip
    env = {**env, "REDIS_URL": server.url, "DIFFQ_HEARTBEAT_TTL": "6"}
    os.environ["REDIS_URL"] = server.url  # the in-process producer
    conn = redis.Redis.from_url(server.url)
    cells = [start(state, env, tmp_path, small_disk) for state in STATES]
    try:
        for cell in cells:
            wait_for(lambda c=cell: reached(c, conn, tmp_path), 300, f"the worker {cell.state}", interval=0.2)
        if not redis_up:
            server.stop()
            for cell in cells:
                wait_for(lambda c=cell: "Redis unreachable" in c.log.read_text(), 60, f"{cell.state}: Redis gone")
        for cell in cells:
            cell.proc.send_signal(signal.SIGTERM)
        if signals == 2:
            time.sleep(1.2)  # past the 1 s in which a repeat counts as the same request
            for cell in cells:
                cell.proc.send_signal(signal.SIGTERM)
        last = time.monotonic()
        if signals == 1:
            (tmp_path / "release").touch()  # the held load and writer go on: their jobs can finish
        wait_exit(cells, last, LIMIT_S.get((redis_up, signals), 240.0))
        took = {c.state: (c.exited_after, c.proc.returncode) for c in cells}
        print(f"redis {'up' if redis_up else 'down'}, {signals} signal(s): {took}")
        for cell in cells:
            assert cell.exited_after is not None, f"{cell.state}: still running; log:\n{cell.log.read_text()[-3000:]}"
            expected = {0} if (redis_up and signals == 1) else ({1} if signals == 2 else {0, 75})
            if signals == 2 and cell.state in ("idle", "paused"):  # gone, or going, after the first one
                expected = {0, 1, -signal.SIGTERM}
            assert cell.proc.returncode in expected, (
                f"{cell.state}: exit {cell.proc.returncode}\n{cell.log.read_text()[-3000:]}"
            )
            text = cell.log.read_text()
            assert "Traceback" not in text, f"{cell.state}:\n{text[-3000:]}"
            assert "starting: importing torch" in text.splitlines()[0]  # said before the imports' silence
            assert text.count("loading model tiny") <= 1
            if signals == 2 and cell.exited_after is not None and cell.proc.returncode == 1:
                # the state the cold stop found is the one docs/architecture.md draws for the cell
                found = [state for state in DRAWN[cell.state] if f"(was {state}): cold shutdown" in text]
                assert found, f"{cell.state}: not one of {DRAWN[cell.state]}:\n{text[-3000:]}"
        if redis_up and signals == 1:  # idle and paused workers do not wait for anything
            assert took["idle"][0] < 10 and took["paused"][0] < 10, took
    finally:
        for cell in cells:
            if cell.proc.poll() is None:
                cell.proc.kill()
                cell.proc.wait(30)
    if not redis_up:
        server.start()
    (small_disk / "filler").unlink()
    drain = []
    for c in cells:
        if c.images:
            log = tmp_path / f"drain-{c.state}.log"
            with log.open("w") as handle:  # kept: what a drain that does not end was waiting for
                proc = subprocess.Popen(
                    worker_cmd("run", "--burst", "--device", "cpu", "--queue", c.state),
                    env=env,
                    cwd=ROOT,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                )
            drain.append((proc, log))
    for proc, log in drain:
        try:
            code = proc.wait(600)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"the drain did not end in 600 s; its log:\n{log.read_text()[-3000:]}") from None
        assert code == 0, log.read_text()[-3000:]
    for cell in cells:
        if cell.images:
            assert_exactly_once(cell.out, cell.images)


def test_the_hard_exit_timer_keeps_a_margin_inside_the_promise():
    """Finding 7: the cold-exit timer was the promise itself (1.5 s), and two of seven exits were
    measured at 1.538 s. The timer now fires a third of the promise early, and README states the
    promise this test holds the timer to."""
    from worker.serving.signals import COLD_EXIT_PROMISE_S, COLD_EXIT_S

    assert COLD_EXIT_S <= COLD_EXIT_PROMISE_S * 2 / 3
    assert f"within {COLD_EXIT_PROMISE_S:g} s, even with Redis down" in " ".join(
        (ROOT / "README.md").read_text().split()
    )
