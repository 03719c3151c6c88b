"""``python tests/tied.py SCRIPT ARGS...``: SCRIPT run as ``__main__`` in a process that dies with
its parent (torchrun's agent, for the ranks of :func:`conftest.run_ranks`): tests/lifeline.py."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lifeline import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")
