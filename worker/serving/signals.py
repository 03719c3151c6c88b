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
