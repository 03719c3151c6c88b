"""Ctrl-C / SIGTERM / SIGHUP that are heard at once, whatever the job is doing.

Python runs a signal handler only in the main thread, between two bytecodes: while the main
thread is inside one long C call (loading a model, a VAE decode at 4096², a big convolution)
the handler waits for it, and a second signal that arrives before the first was handled is
merged into it. So the C-level handler writes each signal's number to a pipe
(``signal.set_wakeup_fd``) and a watcher thread reads the pipe: it hears every signal within
milliseconds, while the main thread computes.

What the watcher does is the worker's business (:class:`SignalWatcher` takes two callbacks):
the first signal asks for a warm stop, a second one more than :data:`REPEAT_S` later for a
cold stop. The same signal delivered twice within :data:`REPEAT_S` (the launcher and the
terminal both send it) counts once. Both run on the watcher thread itself: a warm stop only
sets flags (it never waits on Redis, so the second signal is heard at once), and a cold stop
is the last thing the process does (its calls bounded, a timer behind them).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
from rq.exceptions import StopRequested

from common.queues import WARM_STOP_REDIS_S, WAY_OUT
from worker.serving.states import State

log = logging.getLogger("diffq.worker")

#: exit status after a cold (second-signal) stop
EXIT_COLD = 1
#: exit status when this worker's GPU lease was taken by another (the supervisor restarts it)
EXIT_LEASE_LOST = 3
#: exit status of a stop that Redis did not answer: the running job comes back by its heartbeat
EXIT_REDIS_GONE = 75  # EX_TEMPFAIL
#: the promise (README): after the second signal the process is gone within this many seconds
COLD_EXIT_PROMISE_S = 1.5
#: the hard-exit timer: a third of the promise kept back for a loaded machine's scheduling (the
#: timer itself was 1.5 s once, and exits were measured at 1.538 s)
COLD_EXIT_S = 1.0

#: the signals that stop a worker: Ctrl-C, SIGTERM (compose, Slurm, a launcher) and SIGHUP (its
#: terminal closed, an ssh session dropped), each a warm stop first
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: a repeat of the signal within this many seconds is the same request, delivered twice
REPEAT_S = 1.0


class SignalWatcher:
    def __init__(self, warm: Callable[[str], None], cold: Callable[[str], None]) -> None:
        self.warm = warm
        self.cold = cold
        self.first_at: float | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def install(self, main_thread_handler: Callable[[int, FrameType | None], None]) -> None:
        """From the main thread: route SIGINT/SIGTERM through the pipe to the watcher thread.
        ``main_thread_handler`` still runs in the main thread, whenever Python gets to it (an
        idle worker blocked waiting for a job must be woken there)."""
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in SIGNALS:
            signal.signal(signum, main_thread_handler)
        threading.Thread(target=self._watch, name="diffq-signals", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except InterruptedError:
                continue
            for signum in data:
                if signum in SIGNALS:
                    self._heard(signal.Signals(signum).name)

    def _heard(self, name: str) -> None:
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
            self.warm(name)
        elif now - self.first_at >= REPEAT_S:
            self.cold(name)


class Stops:
    """Stopping as a part of the worker: the signals heard (installed at the worker's boot, from
    its main thread), the warm stop they ask for first and the cold one after. ``worker`` is the
    RQ worker, typed loosely as the keeper's; ``exit`` ends the process (``os._exit``: a cold stop
    must not wait for the interpreter's finalization)."""

    name = "stops"

    def __init__(self, worker: Any, exit: Callable[[int], None] = os._exit) -> None:
        self.worker = worker
        self.exit = exit
        #: a cold stop is under way: whichever thread ends the process, it ends with EXIT_COLD
        self.cold_under_way = False
        self.watcher = SignalWatcher(self.warm, self.cold)

    def start(self) -> None:
        self.watcher.install(self.on_main_thread)

    def stop(self) -> None:
        """Nothing to stop: the watcher thread ends with the process."""

    def on_main_thread(self, signum: int, frame: FrameType | None) -> None:
        """Main thread, whenever Python gets to it: a worker waiting for a job (or for Redis, or
        for its disk) stops waiting. Anywhere else the exception would cut through bookkeeping
        (RQ's teardown, a job's completion): there the flag alone ends the loop. The watcher
        thread has already done the rest."""
        self.worker._stop_requested = True
        if self.worker._waiting and self.worker._now is None:
            raise StopRequested()

    def warm(self, signal_name: str) -> None:
        """The first signal: finish the running job, take no other. Redis gets
        :data:`WARM_STOP_REDIS_S` more seconds to answer: past them every call raises instead
        of retrying, the worker exits, and its job comes back by its heartbeat."""
        WAY_OUT.give_up_after(WARM_STOP_REDIS_S)
        self.worker._stop_requested = True
        now = self.worker._now
        doing = f"finishing job {now.job.id}, then exiting" if now is not None else "exiting"
        log.warning("%s: warm shutdown, %s (again for a cold one)", signal_name, doing)

    def cold(self, why: str) -> None:
        """A cold stop (a second signal, or the launcher gone): the job goes back at the front of
        its queue and the process ends now, whatever the main thread is in the middle of."""
        worker = self.worker
        now, was = worker._now, worker.states.now  # one read: the job, its queue and execution together
        self.cold_under_way = True
        worker.states.move(State.GONE)
        # exit in COLD_EXIT_S whatever happens below: Redis may be down, or hung
        timer = threading.Timer(COLD_EXIT_S, self.exit, (EXIT_COLD,))
        timer.daemon = True
        timer.start()
        WAY_OUT.give_up_after(COLD_EXIT_S / 2)
        owned = now is not None and worker._lost != now.job.id
        # said before any Redis call: the timer may end the process while Redis is away
        log.warning("%s (was %s): cold shutdown%s", why, was.value,
                    f"; job {now.job.id} goes back to the front of its queue" if owned else "")  # fmt: skip
        try:
            worker.tails.give_back(f"interrupted by a cold shutdown of {worker.name} while writing; re-queued",
                                   lost=worker._lost)  # fmt: skip
            if owned:
                reason = f"interrupted by a cold shutdown of {worker.name}; re-queued"
                worker.give_back(now.job, now.queue, reason, execution=now.execution)
            worker.register_death()
            if worker.lease is not None:
                worker.lease.release()
        except redis.RedisError as exc:
            log.warning("%s: Redis did not answer (%s): the job comes back by its heartbeat",
                        why, exc.__class__.__name__)  # fmt: skip
        finally:
            logging.shutdown()
            self.exit(EXIT_COLD)

    def wait_for_cold_exit(self) -> None:
        """After the work loop: if a cold stop is under way, it ends the process (its thread,
        or its timer within :data:`COLD_EXIT_S`). The main thread must not end it first by
        returning: the interpreter's finalization stops daemon threads, the timer among them,
        and took seconds (exit 0 at 2.2 s measured, the promise is 1.5 s)."""
        if self.cold_under_way:
            threading.Event().wait()
