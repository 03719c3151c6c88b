"""``worker`` with test-only holds and faults, run as ``python tests/held_worker.py run ...``
(the tests' ``worker_cmd`` runs every worker this way; with none of the variables below set, it
is the shipped worker).

A stop matrix needs a worker caught in one state while a signal lands: loading a model, or
with a job's images in the writer. The product has no switch for that; this wrapper patches
the two places before the real CLI runs, so the worker under test is otherwise the shipped one.

- ``HELD_LOAD=<file>``: the first model load waits until ``<file>`` exists (a slow download).
- ``HELD_WRITER=<file>``: each job's tail waits until ``<file>`` exists (a stalled disk).
- ``HELD_RECORD=<file>``: each job's record step (metadata lines, ledger) waits until ``<file>``
  exists, after its images are written (a disk that fills up in between).
- ``HELD_TAKEN=<file>``: each job the worker takes waits, before its execution is registered
  (in RQ's intermediate list), until ``<file>`` exists (a worker killed as it takes a job).
- ``HELD_STEP=<file>``: each job's denoising waits after its third step (saved to Redis) until ``<file>`` exists
  (a job that is still running however long a test looks at it).
- ``HELD_LEASE_TTL=<s>``: GPU leases live this long instead of 30 s, so a test can outwait one.
- ``HELD_STATE=<file>``: written (``loading`` / ``writing`` / ``recording``) when the worker
  reaches the hold.
- ``DIFFQ_FAULT_*``: the faults of :mod:`faults`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def hold(flag: str, state: str) -> None:
    marker = os.environ.get("HELD_STATE")
    if marker:
        Path(marker).write_text(state)
    while not os.path.exists(flag):
        time.sleep(0.05)


def install() -> None:
    load_flag, writer_flag = os.environ.get("HELD_LOAD"), os.environ.get("HELD_WRITER")
    lease_ttl = os.environ.get("HELD_LEASE_TTL")
    if lease_ttl:
        import worker.supervision.lease as lease

        lease.LEASE_TTL_S = int(lease_ttl)
    taken_flag = os.environ.get("HELD_TAKEN")
    if taken_flag:
        from worker.serving.rqworker import DiffqWorker

        real_execute = DiffqWorker.execute_job

        def execute_job(self, job, queue):  # type: ignore[no-untyped-def]
            hold(taken_flag, "taken")
            return real_execute(self, job, queue)

        DiffqWorker.execute_job = execute_job  # type: ignore[method-assign]
    record_flag = os.environ.get("HELD_RECORD")
    if record_flag:
        import worker.serving.task as task

        real_record = task._record

        def record(*args, **kwargs):  # type: ignore[no-untyped-def]
            hold(record_flag, "recording")
            return real_record(*args, **kwargs)

        task._record = record  # type: ignore[assignment]
    step_flag = os.environ.get("HELD_STEP")
    if step_flag:
        import worker.serving.task as task

        real_on_step = task._on_step

        def on_step(ctx, progress, step, steps):  # type: ignore[no-untyped-def]
            real_on_step(ctx, progress, step, steps)
            if step >= 3:
                progress.update(force=True)  # the step shows in Redis while the job waits
                hold(step_flag, "denoising")

        task._on_step = on_step  # type: ignore[assignment]
    if load_flag:
        from worker.pipelines.warm import WarmPipelines

        real_get = WarmPipelines.get

        def get(self, model, on_progress=None):  # type: ignore[no-untyped-def]
            if model not in getattr(self, "_held", set()):
                self._held = {*getattr(self, "_held", set()), model}
                hold(load_flag, "loading")
            return real_get(self, model, on_progress)

        WarmPipelines.get = get  # type: ignore[method-assign]
    if writer_flag:
        from worker.serving.overlap import Writer

        real_submit = Writer.submit

        def submit(self, tail):  # type: ignore[no-untyped-def]
            def held():  # type: ignore[no-untyped-def]
                hold(writer_flag, "writing")
                return tail()

            return real_submit(self, held)

        Writer.submit = submit  # type: ignore[method-assign]


if __name__ == "__main__":
    from faults import install_worker_faults

    install()
    install_worker_faults()
    from worker.cli import main

    main()
