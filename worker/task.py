"""Where every queued job points: RQ stores ``worker.task.run_job`` in each job it queues
(``common.queues.TASK_FUNC``), so this address stays put whatever moves inside ``worker/``.
The job function itself lives in :mod:`worker.serving.task`."""

from worker.serving.task import run_job

__all__ = ["run_job"]
