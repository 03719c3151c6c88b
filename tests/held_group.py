"""``python -m worker.group`` with the test faults of :mod:`faults`, for torchrun in tests/test_group.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: what a rank prints if its process ends through the interpreter's finalization (tests/test_group.py
#: holds a group's ranks to leaving without it: worker/group/cli.py's _finish)
FINALIZED = "the interpreter finalized rank"

if __name__ == "__main__":
    import atexit
    import os

    from faults import install_group_faults
    from lifeline import die_with_parent

    die_with_parent()  # torchrun's agent gone (the test session SIGKILLed): this rank goes too

    atexit.register(lambda: print(f"{FINALIZED} {os.environ.get('RANK')}", file=sys.stderr, flush=True))
    install_group_faults()
    from worker.group.cli import main

    main()
