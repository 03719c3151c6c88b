"""The boundary with RQ, owned: rq is pinned exactly (pyproject.toml, docker/constraints.txt),
and every RQ method diffq overrides or RQ internal it calls is checked here against the
installed rq, so an upgrade that changes one fails loudly in CI instead of quietly at run time."""

from __future__ import annotations

import inspect
import tomllib

import redis
import rq
from conftest import ROOT
from rq import SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.scheduler import RQScheduler

from common.queues import LeanJob
from worker.group.leader import GroupWorker
from worker.serving.rqworker import DiffqWorker


def shape(func) -> list[tuple[str, object, object]]:
    """Parameter names, kinds and defaults (annotations may be spelt differently)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


def test_rq_is_pinned_to_the_installed_version_everywhere():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"rq=={rq.__version__}" in deps
    assert f"rq=={rq.__version__}" in (ROOT / "docker" / "constraints.txt").read_text().split()


def test_every_override_has_the_installed_rq_signature():
    checked = []
    for cls, base in ((DiffqWorker, SimpleWorker), (GroupWorker, SimpleWorker), (LeanJob, Job)):
        for name, member in vars(cls).items():
            upstream = getattr(base, name, None)
            if callable(member) and callable(upstream) and not name.startswith("__"):
                assert shape(member) == shape(upstream), f"{cls.__name__}.{name} differs from rq's"
                checked.append(f"{cls.__name__}.{name}")
    assert "DiffqWorker.handle_job_failure" in checked and "DiffqWorker.maintain_heartbeats" in checked


def test_the_rq_internals_diffq_relies_on_are_there():
    worker = SimpleWorker([], connection=redis.Redis(), prepare_for_work=False)  # no command is sent
    assert hasattr(worker, "_stop_requested") and hasattr(worker, "_exc_handlers")
    assert {"exc_string", "pipeline", "worker_name"} <= set(inspect.signature(Job._handle_failure).parameters)
    assert {"acquire_locks", "enqueue_scheduled_jobs", "release_locks"} <= set(dir(RQScheduler))
    assert Execution.key.fget is not None and "rq:execution:{self.composite_key}" in inspect.getsource(Execution)
    assert Queue.intermediate_queue_key.fget is not None
    # handle_job_failure reads the job's exception from sys.exc_info(): RQ must call it inside its except
    source = inspect.getsource(SimpleWorker.perform_job)
    assert source.index("except:") < source.index("self.handle_job_failure(")
    # overlap (worker/serving/overlap.py): the job function's return value is on the job when
    # handle_job_success is called, and RQ's completion works on worker.execution, which diffq
    # points at a handed-off job's own execution while it completes it
    assert source.index("job._result = return_value") < source.index("self.handle_job_success(")
    from rq import executions

    cleanup = inspect.getsource(executions.cleanup_execution)
    assert "worker.execution.delete(job=job" in cleanup and "worker.execution = None" in cleanup
    assert "self.execution.id if self.execution" in inspect.getsource(SimpleWorker.handle_job_success)
