"""The worker's states as drawn: a real ``DiffqWorker`` against a real Redis walks every move of
``worker/serving/states.py:MOVES`` but the cold stop's, and makes no other; docs/architecture.md's
table is that table. (A cold stop ends the process: ``tests/test_stop.py`` checks the state each
of its stopped workers was in, from the worker's own last line.)

The jobs here are small functions of this module, not the image job: the states are the
worker's, whatever its job does.
"""

from __future__ import annotations

import re
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import ROOT, wait_for
from rq.job import Job
from rq.serializers import JSONSerializer

from common.errors import OutputUnavailable
from common.queues import get_queue
from worker.serving.rqworker import DiffqWorker
from worker.serving.signals import SIGNALS
from worker.serving.states import MOVES, State, States


def done() -> str:
    return "done"


def full_once(marker: str, output: str) -> str:
    """The output is full the first time (the worker gives the job back and pauses); the probe
    then finds it writable, and the job runs again."""
    if not Path(marker).exists():
        Path(marker).touch()
        raise OutputUnavailable("output full (test)", output=output, needed=0)
    return "done"


def full_for_good(output: str) -> str:
    raise OutputUnavailable("output unwritable (test)", output=output, needed=0)


@pytest.fixture
def handlers() -> Iterator[None]:
    """``work()`` installs the worker's signal handlers in this (pytest's) main thread: put
    pytest's back afterwards."""
    saved = {signum: signal.getsignal(signum) for signum in SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
    signal.set_wakeup_fd(-1)


def run(conn: redis.Redis, func, *args: str, burst: bool = True, before=None, beside=None) -> tuple[Counter, Job]:  # type: ignore[no-untyped-def]
    """One worker, one job: the moves the worker made, and the job afterwards."""
    queue = get_queue(f"states-{func.__name__}-{burst}", conn)
    job = queue.enqueue(f"test_states.{func.__name__}", *args)
    worker = DiffqWorker([queue], connection=conn, heartbeat_ttl=6)
    if before is not None:
        before(worker)
    if beside is not None:
        threading.Thread(target=beside, args=(worker,), daemon=True).start()
    worker.work(burst=burst)
    return worker.states.walked, Job.fetch(job.id, connection=conn, serializer=JSONSerializer)


def test_a_worker_walks_every_move_drawn_and_no_other(conn, tmp_path, handlers, caplog):
    walked: Counter = Counter()
    # a job: starting -> waiting -> running -> waiting -> done (burst, nothing left)
    moves, job = run(conn, done)
    walked += moves
    assert job.is_finished
    # a full output: the job given back (not failed), paused, the probe finds it writable, the job runs again
    moves, job = run(conn, full_once, str(tmp_path / "once"), str(tmp_path / "out"))
    walked += moves
    assert job.is_finished and moves[(State.PAUSED, State.WAITING)] == 1
    # a stop asked for before the first job: the job stays queued
    moves, job = run(conn, done, burst=False, before=DiffqWorker.stop_after_job)
    walked += moves
    assert job.is_queued
    # a stop asked for while paused (the output is a path under a file: never writable)
    (tmp_path / "a-file").write_text("")

    def stop_once_paused(worker: DiffqWorker) -> None:
        wait_for(lambda: worker.states.now is State.PAUSED, 120, "the worker to pause")
        worker.stop_after_job()

    moves, job = run(conn, full_for_good, str(tmp_path / "a-file" / "out"), burst=False, beside=stop_once_paused)
    walked += moves
    assert job.is_queued  # given back at the front, for a worker that can write there
    assert "is not a move the worker has" not in caplog.text
    assert set(walked) <= set(MOVES), f"moves not drawn: {set(walked) - set(MOVES)}"
    cold = {move for move in MOVES if move[1] is State.GONE}
    assert set(MOVES) - cold - set(walked) == set(), f"drawn but never walked: {set(MOVES) - cold - set(walked)}"


def test_a_move_not_drawn_is_said_and_counted(caplog):
    states = States("w")
    states.move(State.WAITING)
    states.move(State.STARTING)
    assert "state: waiting -> starting is not a move the worker has" in caplog.text
    assert states.walked[(State.WAITING, State.STARTING)] == 1
    states.move(State.GONE)
    states.move(State.WAITING)  # nothing moves a worker that is gone
    assert states.now is State.GONE


def test_the_architecture_page_draws_the_moves_the_code_has():
    """docs/architecture.md's table of moves, row for row, is ``MOVES``."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    table = page[page.index("| from | to | when |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.+?) \|$", table, re.M)
    assert {(State(a), State(b)): why for a, b, why in rows} == MOVES
