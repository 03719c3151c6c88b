"""``worker.group`` with parts switched off, to find where a group's per-job overhead goes.

    DIFFQ_BENCH_VARIANT=nothreads,noprogress,gcfreeze torchrun ... bench/group_variant.py --model ...

- ``nothreads``: no keeper thread (heartbeats, retries, reaping) and no RQ pubsub thread
- ``noprogress``: no step progress written to ``job.meta``
- ``gcfreeze``: ``gc.freeze()`` once the model is loaded (start-up objects leave the GC's scans)
- ``timed``: rank 0's main thread timed per job, by part (RQ's bookkeeping, the job function's
  validation and plan, the protocol's broadcast and gather, the engine's call, the hand-off to
  the writer), one JSON line a job in ``DIFFQ_BENCH_TIMED`` (the parts nest: ``perform`` holds
  ``plan``, ``generate`` holds ``group.generate``, which holds ``broadcast``, ``engine.run`` and
  ``gather``)

For diagnosis only: a worker needs its keeper thread to be recovered when it dies.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

variant = set(filter(None, os.environ.get("DIFFQ_BENCH_VARIANT", "").split(",")))
if "nothreads" in variant:
    from rq.worker import BaseWorker

    from worker.serving.keeper import Keeper

    Keeper.run = lambda self: None  # type: ignore[method-assign]
    BaseWorker.subscribe = lambda self: None  # type: ignore[method-assign]
if "noprogress" in variant:
    from worker import task

    task._Progress.update = lambda self, force=False, **fields: None  # type: ignore[method-assign]
if "gcfreeze" in variant:
    from worker.group import cli

    wait = cli._wait_all_loaded

    def wait_then_freeze(rank: int, world: int) -> None:
        wait(rank, world)
        gc.collect()
        gc.freeze()

    cli._wait_all_loaded = wait_then_freeze

if "timed" in variant and os.environ.get("RANK", "0") == "0":
    import functools
    import json
    import time
    from collections import defaultdict
    from typing import Any

    from rq.worker import BaseWorker

    from worker.group import comm, engine, leader
    from worker.serving import overlap, rqworker, task

    spent: defaultdict[str, float] = defaultdict(float)

    def timed(owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - started

        setattr(owner, attr, wrapper)

    for owner, attr, name in [
        (BaseWorker, "prepare_job_execution", "rq.prepare"),
        (BaseWorker, "handle_job_success", "rq.success"),
        (task, "perform", "perform"),
        (task, "open_destination", "open_destination"),
        (task, "_count_attempt", "count_attempt"),
        (task, "_plan", "plan"),
        (task, "_generate", "generate"),
        (leader.GroupPipelines, "generate", "group.generate"),
        (comm.Control, "broadcast", "broadcast"),
        (comm.Control, "gather", "gather"),
        (engine.RankEngine, "_run", "engine.run"),
        (overlap.Tails, "hand_off", "hand_off"),
        (rqworker.DiffqWorker, "_pump", "pump"),
        (overlap.Tails, "finish", "finish_pending"),
    ]:
        timed(owner, attr, name)
    split = engine.run_split

    def split_phases(*args: Any, **kwargs: Any) -> Any:
        result, fitted = split(*args, **kwargs)
        spent["phases"] += result.encode_s + result.denoise_s + result.decode_s
        return result, fitted

    engine.run_split = split_phases
    timed(engine, "run_split", "run_split")
    execute = rqworker.DiffqWorker.execute_job

    def execute_timed(self: Any, job: Any, queue: Any) -> None:
        spent.clear()
        started = time.perf_counter()
        execute(self, job, queue)
        line = {"job": job.id, "execute": time.perf_counter() - started, **spent}
        with open(os.environ["DIFFQ_BENCH_TIMED"], "a") as fh:
            fh.write(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in line.items()}) + "\n")

    rqworker.DiffqWorker.execute_job = execute_timed  # type: ignore[method-assign]

from worker.group.cli import main  # noqa: E402

main()
