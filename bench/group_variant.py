"""``worker.group`` with parts switched off, to find where a group's per-job overhead goes.

    DIFFQ_BENCH_VARIANT=nothreads,noprogress,gcfreeze torchrun ... bench/group_variant.py --model ...

- ``nothreads``: no keeper thread (heartbeats, retries, reaping) and no RQ pubsub thread
- ``noprogress``: no step progress written to ``job.meta``
- ``gcfreeze``: ``gc.freeze()`` once the model is loaded (start-up objects leave the GC's scans)

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

from worker.group.cli import main  # noqa: E402

main()
