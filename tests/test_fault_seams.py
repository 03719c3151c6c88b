"""The seams the fault tests wrap are on a job's path, so a fault test cannot silently lose its fault.

``tests/faults.py`` and ``tests/held_worker.py`` inject faults by wrapping steps of the job
function by name (``task._save``, ``task._record``, ...). Were a refactor to call the step through
another name, the wrapper would never run and the fault test would pass without its fault. Here
one job runs with every seam wrapped by a counter, through RQ's own worker in this process: a
seam the job no longer calls fails by its name, and a new wrapper must be listed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from conftest import ROOT, TINY_FLAGS, producer, write_csv
from rq import SimpleWorker
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

import worker.serving.task as task
from common.queues import get_queue
from worker.pipelines.warm import WarmPipelines

#: (owner, name) of the steps a fault wrapper replaces, each checked here to be on a job's path
SEAMS = [
    (task, "_count_attempt"),
    (task, "_save"),
    (task, "_record"),
    (task, "_on_step"),
    (WarmPipelines, "generate"),
    (WarmPipelines, "get"),
]
#: wrapped seams that check themselves: their tests wait for the state file the hold writes
#: (tests/held_worker.py) or for the rank to fail (tests/test_group.py), or read the lease's
#: lifetime back from the worker's log (tests/test_lease.py), so a bypassed one fails
SELF_CHECKING = {"DiffqWorker.execute_job", "Writer.submit", "RankEngine._run", "lease.LEASE_TTL_S"}


def test_every_seam_the_fault_tests_wrap_is_on_a_jobs_path(env, conn, tmp_path, monkeypatch):
    wrapped = {  # what the wrappers replace: `task._save = save`, `WarmPipelines.generate = generate`
        match
        for path in ("tests/faults.py", "tests/held_worker.py")
        for match in re.findall(r"^\s+(\w+\.\w+) = \w+", (ROOT / path).read_text(), re.M)
    }
    checked = {f"{owner.__name__.rsplit('.', 1)[-1]}.{name}" for owner, name in SEAMS}
    assert wrapped == checked | SELF_CHECKING, f"a wrapper not in SEAMS: {wrapped - checked - SELF_CHECKING}"
    calls: Counter[str] = Counter()

    def counted(name: str, real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    for owner, name in SEAMS:
        monkeypatch.setattr(owner, name, counted(name, getattr(owner, name)))  # raises if renamed
    rows = write_csv(tmp_path / "p.csv", "prompt\na lighthouse\n")
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    queue = get_queue("diffq", conn)
    (job_id,) = queue.job_ids
    SimpleWorker([queue], connection=conn, serializer=JSONSerializer).work(burst=True)
    assert Job.fetch(job_id, connection=conn, serializer=JSONSerializer).get_status() == JobStatus.FINISHED
    assert {name for _, name in SEAMS} - set(calls) == set(), f"seams a job never called: {calls}"
