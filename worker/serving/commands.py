"""RQ's commands (``rq.command.send_command``: stop-job, stop-execution, shutdown): the pubsub
subscription a worker hears them on, a way out that waits for it briefly, and stop-job without
a work-horse.

RQ's way out unsubscribes and then stops the listening thread. Since redis-py 8.2 that stop
joins the thread with no bound, and a thread that had read the unsubscribe's reply by then
waits out its poll for a subscription: RQ's is 60 s, and idle workers exited 61 s after SIGTERM
(CI's tests/test_stop.py, 2026-12-04). Here the thread polls every :data:`POLL_S`, is told to
stop from a thread of its own, and is waited for at most :data:`STOP_S` before its connection
is closed under it (which ends the subscription too).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis.client import PubSub, PubSubWorkerThread

log = logging.getLogger("diffq.worker")

#: the listening thread waits on its socket this long at a time
POLL_S = 0.5
#: the way out waits this long for the listening thread
STOP_S = 2.0


def listen(worker: Any) -> tuple[PubSub, PubSubWorkerThread]:
    """RQ's subscription for ``worker`` (an RQ worker), on a thread that polls every POLL_S."""
    pubsub = worker.connection.pubsub()
    pubsub.subscribe(**{worker.pubsub_channel_name: worker.handle_payload})
    thread = pubsub.run_in_thread(sleep_time=POLL_S, daemon=True, exception_handler=worker._pubsub_exception_handler)
    return pubsub, thread


def stop_listening(pubsub: PubSub, thread: PubSubWorkerThread) -> None:
    """The thread asked to stop (from a thread of its own: redis-py 8.2's stop also joins it),
    waited for at most STOP_S, the connection closed."""
    threading.Thread(target=thread.stop, name="diffq-pubsub-stop", daemon=True).start()
    thread.join(STOP_S)
    pubsub.close()


def stop_job(worker: Any, job_id: str | None) -> None:
    """RQ has set ``_stopped_job_id`` and would kill the work-horse; diffq's worker has none.
    The running job stops at its next denoising step (the worker's ``_pump``), before any of its
    images is written; RQ then marks it ``stopped``, not failed, and does not retry it. Its items
    are not done: ``producer enqueue`` of their file queues them again."""
    now = worker._now
    if now is not None and now.job.id == job_id:
        worker._stop_job = job_id
        log.warning("job %s: stop asked for (RQ command); it stops at its next step", job_id)
    else:
        log.warning("job %s: stop asked for, but it is not denoising here (its images may be being "
                    "written); nothing stopped", job_id)  # fmt: skip
