"""A circuit breaker for models and adapters this worker cannot load.

A typo in a hub id, a model the worker has no access to, an adapter folder not mounted on
this machine: every job that names it fails the same way, and a worker that takes them as
fast as it can fails a whole campaign in minutes. So after :data:`MAX_FAILURES` jobs failed
for the same model or adapter, the breaker opens: further jobs naming it are given back to
the queue (retries untouched) for other workers, and this worker says once, in its log and in
``producer status``, what it no longer takes and why. After :data:`RETRY_AFTER_S` one job may
try again (the file may have been mounted since); if it loads, the breaker closes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from common.errors import NotServedHere

log = logging.getLogger("diffq.worker")

MAX_FAILURES = 2
RETRY_AFTER_S = 300.0


@dataclass
class _State:
    failures: int = 0
    reason: str = ""
    opened_at: float | None = None


@dataclass
class Breaker:
    max_failures: int = MAX_FAILURES
    retry_after_s: float = RETRY_AFTER_S
    _states: dict[str, _State] = field(default_factory=dict)

    def check(self, what: str) -> None:
        """Raise :class:`NotServedHere` if ``what`` (``model 'x'``, ``adapter 'y'``) is open."""
        state = self._states.get(what)
        if state is None or state.opened_at is None:
            return
        if time.monotonic() - state.opened_at >= self.retry_after_s:
            state.opened_at = None  # half open: this job may try once more
            state.failures = self.max_failures - 1
            log.info("trying %s again", what)
            return
        raise NotServedHere(f"this worker does not take jobs for {what} any more: {state.reason}")

    def failed(self, what: str, reason: str) -> None:
        state = self._states.setdefault(what, _State())
        state.failures += 1
        state.reason = reason
        if state.failures >= self.max_failures and state.opened_at is None:
            state.opened_at = time.monotonic()
            log.error(
                "%s failed to load %d times; this worker takes no more jobs for it (they stay queued): %s",
                what,
                state.failures,
                reason,
            )

    def succeeded(self, what: str) -> None:
        if self._states.pop(what, None) is not None:
            log.info("%s loads again; taking its jobs", what)

    def open(self) -> dict[str, str]:
        """What this worker refuses now, and why (for ``producer status``)."""
        return {what: s.reason for what, s in self._states.items() if s.opened_at is not None}
