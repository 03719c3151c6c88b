"""The project's exceptions, with messages written for the person who reads them.

The CLIs turn a :class:`DiffqError` into one line and an exit code; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


class DiffqError(Exception):
    """Base of every error a user can cause and fix; ``str(err)`` is the whole message."""

    exit_code = 1


class ConfigError(DiffqError):
    """A flag, environment variable or connection setting is wrong."""

    exit_code = 2


class CampaignCancelled(DiffqError):
    """``producer cancel`` cancelled the queue's campaign while this enqueue was topping it up."""

    exit_code = 6


class InvalidJobSpec(DiffqError):
    """A job or a row does not describe something we can generate."""

    exit_code = 2


class InputFileError(DiffqError):
    """A prompts file cannot be read or has bad rows; nothing was enqueued."""

    exit_code = 2


class PermanentJobError(DiffqError):
    """A job that can never succeed as written: retrying it would only waste a GPU."""


class ModelLoadError(PermanentJobError):
    """The model named by a job cannot be loaded."""


class AdapterNotFound(PermanentJobError):
    """The adapter named by a job does not exist or cannot be read."""


class OutputNotWritable(PermanentJobError):
    """The job's output folder is not one a worker may write (relative, or outside
    ``DIFFQ_OUTPUT_ROOT``); a folder that is full or read-only is :class:`OutputUnavailable`."""


class OutOfMemory(PermanentJobError):
    """The GPU ran out of memory even for one image at a time: smaller sizes or a bigger GPU."""


class WorkerUnavailable(DiffqError):
    """Not the job's fault: this worker cannot run it here and now (its disk, its mounts, a model
    it cannot load). The job goes back to the queue with its retries untouched, and the worker
    stops taking jobs until the cause is gone; the message says what to fix."""


class OutputUnavailable(WorkerUnavailable):
    """The output folder is full, read-only or gone on this worker. ``output`` and ``needed``
    (bytes) say what the worker must be able to write again before it takes jobs."""

    def __init__(self, message: str, *, output: str = "", needed: int = 0) -> None:
        super().__init__(message)
        self.output = output
        self.needed = needed


class NotServedHere(WorkerUnavailable):
    """This worker failed to load the job's model or adapter several times and no longer tries."""


class NeedsAGroup(WorkerUnavailable):
    """The job does not fit this single-GPU worker (out of memory at one image, or a model that
    would have to be offloaded) and a group serves the campaign: it goes to the group lane
    (:mod:`common.lanes`), retries untouched, and this worker goes on with other jobs."""


class OutputRefused(NotServedHere):
    """This one job's output folder cannot be written by this worker (a file in its place, no
    permission there), while other jobs can: the job is given back for other workers and this
    worker goes on; only a worker-wide condition (full or read-only disk) pauses it."""
