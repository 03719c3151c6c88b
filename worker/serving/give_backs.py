"""Jobs a worker gives back rather than fail: its own environment cannot run them (a full
disk, a bucket it cannot write: the worker pauses), another lane must (a job too big for one
GPU goes to the group lane), or this worker refuses them (a model its breaker opened on: other
workers take them). Retries stay untouched in every case.

Given back in a row, the worker waits longer each time before it takes another job (the queue
may hold nothing else), and a burst worker that went round its whole queue stops.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue

from common.errors import NeedsAGroup, NotServedHere, OutputUnavailable, WorkerUnavailable
from common.lanes import group_lane
from common.queues import get_queue
from common.storage import is_url
from worker.output.images import probe_output
from worker.output.objects import probe_store

log = logging.getLogger("diffq.worker")

#: longest wait after giving back a job this worker does not take
GIVE_BACK_MAX_WAIT_S = 30.0


class GiveBacks:
    """The give-backs as a part of the worker. ``worker`` is the RQ worker, typed loosely as the
    keeper's: its ``give_back`` ends its execution of a job and puts the job back."""

    name = "give-backs"

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        #: jobs given back in a row because this worker does not take them
        self.in_a_row = 0

    def start(self) -> None:
        """Nothing to start: the count begins at the first job given back."""

    def stop(self) -> None:
        """Nothing to stop."""

    def unavailable(self, job: Job, queue: Queue, exc: WorkerUnavailable, execution: Execution | None) -> None:
        """``exc`` says why this worker cannot run ``job``: give it back where it belongs."""
        worker = self.worker
        if isinstance(exc, NeedsAGroup):  # not this worker's trouble: it goes on
            worker.give_back(job, get_queue(group_lane(queue.name), worker.connection), str(exc), execution=execution)
            log.info("job %s: %s", job.id, exc)
            return
        if isinstance(exc, NotServedHere):
            worker.give_back(job, queue, f"{worker.name}: {exc}", execution=execution, at_front=False)  # for others
            self.in_a_row += 1
            log.info("job %s given back: %s", job.id, exc)
            return
        worker.give_back(job, queue, f"given back by {worker.name}: {exc}", execution=execution)
        if isinstance(exc, OutputUnavailable) and exc.output:
            endpoint = worker.runtime.settings.s3_endpoint_url if worker.runtime else ""
            output, needed = exc.output, exc.needed
            if is_url(output):
                worker.pauses.pause(str(exc), lambda: probe_store(output, endpoint))
            else:
                worker.pauses.pause(str(exc), lambda: probe_output(Path(output), needed))

    def wait_after(self, burst: bool) -> bool:
        """After giving jobs back in a row: wait longer each time (the queue may hold nothing
        else); a burst worker that went round the whole queue stops (False)."""
        if burst and self.in_a_row > sum(queue.count for queue in self.worker.queues):
            log.warning("burst: the queue holds only jobs this worker does not take; exiting")
            return False
        deadline = time.monotonic() + min(0.5 * 2 ** (self.in_a_row - 1), GIVE_BACK_MAX_WAIT_S)
        while time.monotonic() < deadline and not self.worker._stop_requested:
            time.sleep(0.2)
        return not self.worker._stop_requested
