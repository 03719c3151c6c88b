"""A worker's pause: it takes no job while its own environment cannot finish one (a full or
read-only output, a bucket it cannot write), and probes until it can. Jobs stay queued for
other workers meanwhile; failing them would turn a disk's problem into a queue of failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from rq.worker import WorkerStatus

from common.errors import WorkerUnavailable
from common.queues import paused_key
from worker.serving.states import State

log = logging.getLogger("diffq.worker")

#: longest wait between two probes of a paused worker's output folder
PAUSE_MAX_BACKOFF_S = 30.0


@dataclass
class Pause:
    reason: str
    probe: Callable[[], None]
    since: float
    backoff: float = 1.0
    next_probe: float = 0.0

    def wait_out(self, stop_requested: Callable[[], bool]) -> bool:
        """Probe with backoff (1 s, doubling to :data:`PAUSE_MAX_BACKOFF_S`) until the probe
        passes (True) or a stop is asked for (False); a stop is heard within half a second."""
        while True:
            if stop_requested():
                return False
            left = self.next_probe - time.monotonic()
            if left > 0:
                time.sleep(min(left, 0.5))
                continue
            try:
                self.probe()
            except WorkerUnavailable:
                self.backoff = min(self.backoff * 2, PAUSE_MAX_BACKOFF_S)
                self.next_probe = time.monotonic() + self.backoff
                continue
            log.warning("resumed after %.0fs: %s", time.time() - self.since, "the output folder can take jobs again")
            return True


class Pauses:
    """The pause as a part of the worker: the pause now (``now``, None while it takes jobs),
    told to Redis by the keeper (``publish_pauses``) and to the metrics. ``worker`` is the RQ
    worker, typed loosely as the keeper's."""

    name = "pauses"

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.now: Pause | None = None

    def start(self) -> None:
        """Nothing to start: a pause begins with the first job the environment refuses."""

    def stop(self) -> None:
        """This worker's pause leaves ``producer status`` with it."""
        self.worker.connection.hdel(paused_key(self.worker.queues[0].name), self.worker.name)

    def pause(self, reason: str, probe: Callable[[], None]) -> None:
        """Take no job until ``probe`` passes; it is tried with backoff while the keeper keeps
        the worker alive. Said once in the log, and kept in Redis for ``producer status``."""
        self.now = Pause(reason, probe, since=time.time(), next_probe=time.monotonic() + 1.0)
        log.error("paused, jobs stay queued: %s", reason)
        self._metrics("output")
        try:
            self.worker.set_state(WorkerStatus.SUSPENDED)
            self.worker.keeper.publish_pauses()
        except redis.RedisError as exc:
            log.warning("the pause is not shown in Redis yet (%s); the keeper tries again", exc.__class__.__name__)

    def wait_out(self, stop_requested: Callable[[], bool]) -> bool:
        """Probe until the pause is over (True), or a stop is asked for (False)."""
        pause = self.now
        if pause is None:
            return True
        self.worker.states.move(State.PAUSED)
        if not pause.wait_out(stop_requested):
            return False
        self.worker.states.move(State.WAITING)
        self.now = None
        self._metrics(None)
        try:
            self.worker.keeper.publish_pauses()
        except redis.RedisError as exc:
            log.warning("the end of the pause is not shown in Redis yet (%s); the keeper tries again",
                        exc.__class__.__name__)  # fmt: skip
        return True

    def _metrics(self, why: str | None) -> None:
        runtime = self.worker.runtime
        if runtime is not None and runtime.metrics is not None:
            runtime.metrics.paused(why)
