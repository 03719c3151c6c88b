"""The worker's states, the moves between them, and the one record of the job it runs.

A diffq worker has up to seven threads (docs/architecture.md lists them). Two things they
share used to be loose fields read without a lock: which state the worker is in, and which job
it runs (job, queue and execution, three fields a signal thread could read half-updated). Both
live here now, each with one writer:

- :class:`States`: the main thread moves the worker between :class:`State` s; only the moves in
  :data:`MOVES` exist (the drawing in docs/architecture.md is this table, and
  ``tests/test_states.py`` walks every move with a real worker and Redis). The one move another
  thread makes is the last: a cold stop ends the process from any state (``GONE``).
- :class:`Running`: the running job, its queue and its execution in one frozen value. The main
  thread replaces it whole; any thread reads it with one attribute read and gets a consistent
  triple, never a job with another job's queue.

A move that is not in :data:`MOVES` is a bug, not a reason to stop serving: it is logged as an
error (the tests fail on that line) and made anyway.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("diffq.worker")


class State(enum.Enum):
    STARTING = "starting"  # constructed; RQ's work loop has not asked for a job yet
    WAITING = "waiting"  # asking Redis for a job (and completing a handed-off job's tail)
    RUNNING = "running"  # in execute_job: a job of its own, denoising or loading its model
    PAUSED = "paused"  # the output is full or unwritable: probing with backoff, taking no job
    DONE = "done"  # the work loop ended: teardown, then exit
    GONE = "gone"  # a cold stop: the running and handed-off jobs given back, the process ends now


#: every move there is, and what makes it (docs/architecture.md's table is this one, checked)
MOVES: dict[tuple[State, State], str] = {
    (State.STARTING, State.WAITING): "the work loop asks for its first job",
    (State.STARTING, State.DONE): "a stop asked for before the first job",
    (State.WAITING, State.RUNNING): "a job taken from the queue",
    (State.RUNNING, State.WAITING): "the job completed, failed, was given back, or its tail went to the writer",
    (State.WAITING, State.PAUSED): "a job (or a tail) found the output full or unwritable and was given back",
    (State.PAUSED, State.WAITING): "the probe could write to the output again",
    (State.PAUSED, State.DONE): "a stop asked for while paused",
    (State.WAITING, State.DONE): "a burst worker found no more work, or a stop was asked for",
    **{
        (state, State.GONE): "a second signal, or the launcher gone (another thread)"
        for state in (State.STARTING, State.WAITING, State.RUNNING, State.PAUSED, State.DONE)
    },
}


@dataclass(frozen=True)
class Running:
    """The job the main thread runs. ``execution`` is None until RQ has registered it."""

    job: Any  # rq.job.Job (typed loosely: this module is RQ-free)
    queue: Any  # rq.queue.Queue
    execution: Any = None  # rq.executions.Execution


class States:
    """The worker's state; moves are logged at DEBUG (``state: waiting -> running``) and counted."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._current = State.STARTING
        self._lock = threading.Lock()
        #: every move made, with how often: what the tests read
        self.walked: Counter[tuple[State, State]] = Counter()

    @property
    def now(self) -> State:
        return self._current

    def move(self, to: State) -> None:
        """Go to ``to``; a move to the state the worker is in is no move."""
        with self._lock:
            was = self._current
            if was is to or was is State.GONE:
                return
            self._current = to
            self.walked[(was, to)] += 1
        if (was, to) not in MOVES:
            log.error("state: %s -> %s is not a move the worker has (worker/serving/states.py)", was.value, to.value)
        else:
            log.debug("state: %s -> %s", was.value, to.value)
