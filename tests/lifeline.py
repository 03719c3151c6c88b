"""The test session stops when asked, and nothing it started outlives it.

- SIGINT, SIGTERM and SIGHUP end the session (pytest's ``KeyboardInterrupt``: the running test
  stops, fixtures tear down, the servers they started stop), even where the code under test
  catches the ``KeyboardInterrupt`` (RQ's work loop catches everything).
- Code under test in pytest's own process (an in-process RQ or diffq worker) never takes
  SIGINT, SIGTERM or SIGHUP from pytest: its ``signal.signal`` and ``signal.set_wakeup_fd`` calls
  for them are kept aside for the test's length, so Ctrl-C still stops the suite, and no
  handler is left behind for the tests after it.
- Every process the session starts from its main thread dies with the session, even if pytest
  is SIGKILLed: it starts under ``setpriv --pdeathsig KILL`` (util-linux), so the kernel kills it
  when pytest goes, as ``worker launch``'s lifeline ends its workers. A process of ours that
  starts processes of its own (torchrun's ranks) ties them the same way (:func:`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SETPRIV = shutil.which("setpriv")
_PR_SET_PDEATHSIG = 1


#: the stop signals the session has received (a test that swallowed the KeyboardInterrupt, as
#: RQ's work loop does, is followed by another one when it ends)
HEARD: list[str] = []


def stop_like_ctrl_c(signum: int, _frame: Any) -> None:
    HEARD.append(signal.Signals(signum).name)
    raise KeyboardInterrupt(f"{HEARD[-1]}: the test session stops")


def install_session_handlers() -> None:
    """pytest's main thread: SIGINT, SIGTERM and SIGHUP stop the session."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop_like_ctrl_c)


class KeptSignals:
    """``signal.signal`` and ``signal.set_wakeup_fd`` as code under test sees them: for the stop
    signals they record what it asks for and install nothing (``getsignal`` answers from that
    record); every other signal goes through."""

    def __init__(self) -> None:
        self.asked: dict[int, Any] = {}
        self._signal, self._getsignal, self._wakeup = signal.signal, signal.getsignal, signal.set_wakeup_fd

    def signal(self, signum: int, handler: Any) -> Any:
        if signum in STOP_SIGNALS and threading.current_thread() is threading.main_thread():
            before = self.getsignal(signum)
            self.asked[signum] = handler
            return before
        return self._signal(signum, handler)

    def getsignal(self, signum: int) -> Any:
        return self.asked[signum] if signum in self.asked else self._getsignal(signum)

    def set_wakeup_fd(self, fd: int, **_kwargs: Any) -> int:
        return -1  # pytest's process keeps no wakeup fd: a C-level write per signal would go nowhere


def kept_signals() -> Iterator[KeptSignals]:
    """For one test (an autouse fixture): stop signals stay pytest's, and whatever the test
    asked for is forgotten afterwards."""
    kept = KeptSignals()
    real = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    signal.signal, signal.getsignal, signal.set_wakeup_fd = kept.signal, kept.getsignal, kept.set_wakeup_fd
    try:
        yield kept
    finally:
        signal.signal, signal.getsignal, signal.set_wakeup_fd = kept._signal, kept._getsignal, kept._wakeup
        for signum, handler in real.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)
    if HEARD:  # the code under test caught the KeyboardInterrupt: the session still stops
        raise KeyboardInterrupt(f"{HEARD[0]}: the test session stops")


def _tied(args: Any, kwargs: dict[str, Any]) -> Any:
    """``args`` of a Popen started under ``setpriv --pdeathsig KILL``, or as they were where that
    cannot apply (not the main thread, whose death the kernel watches; a shell string; no setpriv)."""
    if SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return args
    if kwargs.get("executable") is not None:
        return args
    if kwargs.get("shell"):
        if not isinstance(args, str):
            return args
        kwargs["shell"] = False
        return [SETPRIV, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", args]
    if isinstance(args, str | bytes | os.PathLike):
        args = [args]
    return [SETPRIV, "--pdeathsig", "KILL", "--", *args]


class TiedPopen(subprocess.Popen):
    """``subprocess.Popen`` whose process dies with this one (see the module's docstring)."""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        if rest:  # positional options (bufsize, executable, ...): leave the call as it is
            super().__init__(args, *rest, **kwargs)
            return
        super().__init__(_tied(args, kwargs), **kwargs)


def tie_children() -> None:
    """Every ``subprocess.Popen`` (so ``subprocess.run``) of this process from now on is tied."""
    subprocess.Popen = TiedPopen  # type: ignore[misc]


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """This process gets ``signum`` when its parent dies (already gone: exit now)."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
