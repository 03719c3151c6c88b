"""Why a group's ranks end with ``os._exit`` (worker/group/cli.py's ``_finish``): two gloo ranks
run functional all-to-alls (what a FLUX split runs), leave the process group and exit, again and
again; each exit either through the interpreter's finalization or, with ``--leave``, by
``os._exit``. Prints how many of the runs aborted.

    python3 bench/exit_abort.py --runs 40           # 7 of 40 aborted (2 CPU cores, torch 2.13, 2026-11-28)
    python3 bench/exit_abort.py --runs 40 --leave   # 0 of 40

An abort is ``terminate called without an active exception`` (SIGABRT): gloo's run-loop thread
lets go of a finished all-to-all's tensors after the main thread has moved on, and when that
happens during finalization it takes the GIL from a dying interpreter and is cancelled inside a
C++ destructor (under gdb: ``AsyncAlltoallWork::~AsyncAlltoallWork`` → ``decref_pyobject`` →
``take_gil`` → ``pthread_exit``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def rank(leave: bool) -> None:
    """One rank: 20 functional all-to-alls over the world, then the teardown and the exit."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    dist.init_process_group("gloo")
    for _ in range(20):
        funcol.all_to_all_single(torch.randn(8, 64), None, None, dist.group.WORLD).wait()
    dist.destroy_process_group()
    if leave:
        sys.stdout.flush()
        os._exit(0)
    sys.exit(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--leave", action="store_true", help="end each rank with os._exit, as the product does")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # torchrun runs this file so
    args = ap.parse_args()
    if args.rank:
        rank(args.leave)
    aborted = 0
    for _ in range(args.runs):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   __file__, "--rank", *(["--leave"] if args.leave else [])]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        aborted += "terminate called without an active exception" in done.stderr
    print(f"{aborted} of {args.runs} runs aborted at exit ({'os._exit' if args.leave else 'finalization'})")


if __name__ == "__main__":
    main()
