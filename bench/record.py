"""One schema for a benchmark's raw lines in ``bench/results/``: every line says what it measured
with (the commit, the machine, the versions, the command) beside its own numbers, so a figure
can be traced to its run and compared only with lines of the same call.

The device machine gets a copy of the working tree without ``.git``: the caller passes the
commit in ``BENCH_COMMIT`` (``git rev-parse --short HEAD`` where the call is made).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


@functools.cache
def environment() -> dict[str, Any]:
    """The fields every line carries: ``commit``, ``gpu_name``, ``host_cpu``, versions, ``command``."""
    import torch

    commit = os.environ.get("BENCH_COMMIT") or _git_commit()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("diffusers", "transformers", "triton"):
        with contextlib.suppress(ImportError):
            versions[name] = __import__(name).__version__
    return {
        "commit": commit,
        "gpu_name": gpu,
        "host_cpu": platform.processor() or platform.machine(),
        "versions": versions,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }


def _git_commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def write(out: Path | None, case: str, **fields: Any) -> dict[str, Any]:
    """Print one line (``case``, the environment, ``fields``, the time) and append it to ``out``."""
    row = {"case": case, **fields, **environment(), "at": round(time.time(), 1)}
    print(json.dumps(row), flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
    return row
