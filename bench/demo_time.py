"""How long ``make demo`` takes once installed: README's figure for it, measured, not typed.

Runs ``bash examples/demo.sh`` (what ``make demo`` runs after its install step) in a fresh
process and appends one JSON line: the seconds, the images it reported and the machine's CPU
count. Run it on an otherwise idle machine; a loaded one measures the load.

    .venv/bin/python bench/demo_time.py --out bench/results/demo-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    start = time.monotonic()
    run = subprocess.run(["bash", "examples/demo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - start
    images = re.findall(r"^== (\d+) images in", run.stdout, re.M)
    line = {
        "kind": "demo",
        "seconds": round(seconds, 1),
        "rc": run.returncode,
        "images": int(images[-1]) if images else None,
        "cpus": os.cpu_count(),
        "load_1min_before": load,
    }
    with args.out.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
    print(json.dumps(line))


if __name__ == "__main__":
    main()
