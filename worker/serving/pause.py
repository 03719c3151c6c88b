"""A worker's pause: it takes no job while its own environment cannot finish one (a full or
read-only output, a bucket it cannot write), and probes until it can. Jobs stay queued for
other workers meanwhile; failing them would turn a disk's problem into a queue of failures."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from common.errors import WorkerUnavailable

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
