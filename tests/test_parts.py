"""The worker's parts (worker/serving/parts.py), each alone against a stand-in for the RQ
worker: no worker process, no Redis. The process tests (test_overlap, test_stop,
test_campaign_state, test_failures, test_object_storage) check the same parts together in a
real worker; these say what each part promises, in seconds."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from rq.exceptions import StopRequested
from rq.worker import WorkerStatus

from common.errors import NeedsAGroup, NotServedHere, OutputUnavailable
from common.queues import get_queue, paused_key
from worker.serving.failures import Failure, FailureLog
from worker.serving.give_backs import GiveBacks
from worker.serving.overlap import Tails
from worker.serving.parts import Parts
from worker.serving.pause import Pauses
from worker.serving.signals import EXIT_COLD, Stops
from worker.serving.states import Running, State, States


@dataclass
class Job:
    id: str


@dataclass
class Queue:
    name: str
    count: int = 0


class Conn:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str]] = []

    def hdel(self, key: str, name: str) -> None:
        self.deleted.append((key, name))


class Metrics:
    def __init__(self) -> None:
        self.paused_for: list[str | None] = []

    def paused(self, why: str | None) -> None:
        self.paused_for.append(why)


class Keeper:
    def __init__(self) -> None:
        self.published = 0

    def publish_pauses(self) -> None:
        self.published += 1


@dataclass
class Worker:
    """What the parts read and call of a DiffqWorker, and a record of the calls."""

    name: str = "w1"
    queues: list[Queue] = field(default_factory=lambda: [Queue("diffq", count=3)])
    connection: Conn = field(default_factory=Conn)
    states: States = field(default_factory=States)
    keeper: Keeper = field(default_factory=Keeper)
    runtime: Any = None
    lease: Any = None
    _now: Running | None = None
    _lost: str | None = None
    _waiting: bool = False
    _stop_requested: bool = False
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    refuse_redis: bool = False

    def give_back(self, job: Job, queue: Any, reason: str, *, execution: Any = None, at_front: bool = True) -> None:
        if self.refuse_redis:
            raise redis.ConnectionError("Redis is away")
        self.calls.append(("give_back", job.id, getattr(queue, "name", queue), reason, execution, at_front))

    def handle_job_success(self, job: Job, queue: Any, registry: Any, execution: Any) -> None:
        self.calls.append(("success", job.id, execution))

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        self.calls.append(("exception", job.id, type(exc_info[1]).__name__))

    def handle_job_failure(self, job: Job, queue: Any, registry: Any, exc_string: str, execution: Any) -> None:
        self.calls.append(("failure", job.id, "OSError" in exc_string, execution))

    def set_state(self, state: WorkerStatus) -> None:
        self.calls.append(("set_state", state))

    def register_death(self) -> None:
        self.calls.append(("death",))


class Recorder:
    def __init__(self, name: str, seen: list[str], fail_stop: bool = False) -> None:
        self.name, self.seen, self.fail_stop = name, seen, fail_stop

    def start(self) -> None:
        self.seen.append(f"start {self.name}")

    def stop(self) -> None:
        self.seen.append(f"stop {self.name}")
        if self.fail_stop:
            raise redis.ConnectionError("gone")


def test_parts_start_in_their_order_and_stop_in_reverse_and_a_redis_error_stops_no_other(caplog):
    seen: list[str] = []
    parts = Parts(Recorder("pauses", seen), Recorder("keeper", seen, fail_stop=True), Recorder("tails", seen))
    parts.start()
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        parts.stop()
    assert seen == ["start pauses", "start keeper", "start tails", "stop tails", "stop keeper", "stop pauses"]
    assert "keeper: Redis did not answer on the way out (ConnectionError)" in caplog.text


def test_the_real_worker_declares_its_parts_in_the_order_their_lives_need(conn):
    """The keeper renews the writer's last job until the tails part completed it (so tails
    stops first), and the pause is cleared from Redis only after the keeper stopped
    republishing it."""
    from worker.serving.rqworker import DiffqWorker

    worker = DiffqWorker([get_queue("diffq", conn)], connection=conn, prepare_for_work=False)
    assert [part.name for part in worker.parts.order] == ["stops", "pauses", "give-backs", "keeper", "tails"]


def done(value: Any = None, error: BaseException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(error) if error is not None else future.set_result(value)
    return future


def test_tails_completes_the_handed_off_job_once_its_writer_is_done_and_fails_it_as_rq_would():
    worker = Worker()
    tails = Tails(worker, threading.RLock(), overlap=True)
    written = threading.Event()
    result = tails.hand_off(lambda: (written.wait(30), {"images": 2})[1])
    assert tails.keep(Job("j0"), Queue("diffq"), None, "x0")  # handed: completed when the writer is done
    assert tails.pending is not None and tails.pending.job.id == "j0" and not tails.ready()
    assert tails.execution_of(Job("j0")) == "x0" and tails.execution_of(Job("other")) is None
    written.set()
    tails.finish()
    assert result == {"images": 2} and tails.pending is None
    assert worker.calls == [("success", "j0", "x0")]
    tails.handed = done(error=OSError(28, "No space left on device"))
    assert tails.keep(Job("j1"), Queue("diffq"), None, "x1") and tails.ready()
    tails.finish()
    assert worker.calls[1:] == [("exception", "j1", "OSError"), ("failure", "j1", True, "x1")]
    assert not tails.keep(Job("j2"), Queue("diffq"), None, "x2")  # nothing handed: RQ completes it now
    tails.stop()


def test_tails_gives_back_the_writers_job_on_a_cold_stop_unless_another_worker_has_it(caplog):
    worker = Worker()
    tails = Tails(worker, threading.RLock(), overlap=False)
    for lost, expected in ((None, 1), ("j0", 0)):
        worker.calls.clear()
        tails.handed = done({})
        tails.keep(Job("j0"), Queue("diffq"), None, "x0")
        tails.give_back("cold", lost=lost)
        assert tails.pending is None and len(worker.calls) == expected
    tails.handed = done({})
    tails.keep(Job("j3"), Queue("diffq"), None, "x3")
    worker.handle_job_success = lambda *a: (_ for _ in ()).throw(redis.ConnectionError("away"))  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        tails.finish_on_the_way_out()
    assert "comes back by its heartbeat" in caplog.text and tails.pending is None


def test_a_pause_probes_until_the_output_takes_jobs_and_a_stop_ends_it(monkeypatch):
    import worker.serving.pause as pause_module

    monkeypatch.setattr(pause_module.time, "sleep", lambda s: None)
    worker = Worker(runtime=type("Runtime", (), {"metrics": Metrics()})())
    pauses = Pauses(worker)
    tries = iter([OutputUnavailable("disk full"), None])

    def probe() -> None:
        exc = next(tries)
        if exc is not None:
            raise exc

    worker.states.move(State.WAITING)
    pauses.pause("output full", probe)
    assert pauses.now is not None and ("set_state", WorkerStatus.SUSPENDED) in worker.calls
    assert worker.keeper.published == 1 and worker.runtime.metrics.paused_for == ["output"]
    pauses.now.next_probe = 0.0
    assert pauses.wait_out(lambda: False)
    assert pauses.now is None and worker.states.now is State.WAITING
    assert worker.states.walked[(State.WAITING, State.PAUSED)] == 1 and worker.runtime.metrics.paused_for[-1] is None
    pauses.pause("output full", lambda: None)
    assert not pauses.wait_out(lambda: True) and pauses.now is not None  # a stop: still paused, exits
    pauses.stop()
    assert worker.connection.deleted == [(paused_key("diffq"), "w1")]


def test_give_backs_route_each_reason_and_a_burst_worker_stops_after_going_round_its_queue(monkeypatch):
    import worker.serving.give_backs as module

    monkeypatch.setattr(module.time, "sleep", lambda s: None)
    worker = Worker()
    worker.pauses = Pauses(worker)  # type: ignore[attr-defined]
    worker.connection = None  # type: ignore[assignment]  # get_queue only names the group lane's queue
    give_backs = GiveBacks(worker)
    monkeypatch.setattr(module, "get_queue", lambda name, conn: Queue(name))
    give_backs.unavailable(Job("big"), Queue("diffq"), NeedsAGroup("4096² needs a group"), "x1")
    give_backs.unavailable(Job("m"), Queue("diffq"), NotServedHere("model 'x' does not load"), "x2")
    give_backs.unavailable(Job("d"), Queue("diffq"), OutputUnavailable("disk full", output="/nowhere"), "x3")
    (lane, others, full) = worker.calls[:3]
    assert lane[:2] == ("give_back", "big") and lane[2] != "diffq" and lane[5] is True
    assert others[:3] == ("give_back", "m", "diffq") and others[5] is False  # the back of the queue, for others
    assert full[:3] == ("give_back", "d", "diffq") and full[5] is True
    assert worker.pauses.now is not None and "disk full" in worker.pauses.now.reason  # type: ignore[attr-defined]
    assert give_backs.in_a_row == 1
    assert give_backs.wait_after(burst=True)  # 1 given back, 3 queued: go on
    give_backs.in_a_row = 4
    assert not give_backs.wait_after(burst=True)  # round the whole queue: stop


def test_the_first_signal_asks_for_a_warm_stop_and_wakes_only_a_waiting_idle_worker():
    worker = Worker()
    stops = Stops(worker, exit=lambda code: None)
    stops.warm("SIGTERM")
    assert worker._stop_requested
    worker._now = Running(Job("j"), Queue("diffq"))
    worker._waiting = True
    stops.on_main_thread(15, None)  # a job runs: the flag alone ends the loop after it
    worker._now = None
    with pytest.raises(StopRequested):
        stops.on_main_thread(15, None)


def test_a_cold_stop_gives_back_both_jobs_and_exits_and_exits_in_time_when_redis_hangs():
    worker = Worker()
    worker.tails = Tails(worker, threading.RLock(), overlap=False)  # type: ignore[attr-defined]
    worker.tails.handed = done({})  # type: ignore[attr-defined]
    worker.tails.keep(Job("written"), Queue("diffq"), None, "x0")  # type: ignore[attr-defined]
    worker._now = Running(Job("running"), Queue("diffq"), "x1")
    exits: list[int] = []
    Stops(worker, exit=exits.append).cold("SIGTERM")
    gave = [(c[1], c[5]) for c in worker.calls if c[0] == "give_back"]
    assert gave == [("written", True), ("running", True)] and ("death",) in worker.calls
    assert exits == [EXIT_COLD] and worker.states.now is State.GONE

    hung = Worker(_now=Running(Job("running"), Queue("diffq"), "x1"))
    hung.tails = Tails(hung, threading.RLock(), overlap=False)  # type: ignore[attr-defined]
    release, exited = threading.Event(), threading.Event()
    hung.register_death = lambda: release.wait(60)  # type: ignore[method-assign]
    codes: list[int] = []
    stops = Stops(hung, exit=lambda code: (codes.append(code), exited.set()))
    threading.Thread(target=stops.cold, args=("SIGTERM",), daemon=True).start()
    assert exited.wait(30), "the cold-exit timer did not end the process"
    assert codes[0] == EXIT_COLD and stops.cold_under_way
    release.set()


def test_a_repeated_failure_reason_is_said_once_then_counted(caplog):
    failures = FailureLog()
    with caplog.at_level(logging.ERROR, logger="diffq.worker"):
        for n in range(100):
            failures.say(f"j{n}", ValueError("bad column"), Failure(True, "column 'steps' is not a number"))
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "job j0 failed: column 'steps' is not a number"
    assert said[1:] == [
        "job j9 failed: column 'steps' is not a number (the same reason 10 times so far)",
        "job j99 failed: column 'steps' is not a number (the same reason 100 times so far)",
    ]
