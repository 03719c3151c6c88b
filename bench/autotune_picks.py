"""Inductor's GEMM autotuning, per shape, from a compile log: its best kernel against cuBLAS.

``max_autotune_gemm`` prints, for every matrix product it tunes, the ten fastest of its choices
(Triton templates and the ATen/cuBLAS call). This turns those blocks into JSON lines: the
shape, the best choice and its time, and cuBLAS's time when it is among the ten shown (else the
tenth's time, a lower bound for cuBLAS). ``bench/unet_levers.py --variants gemmtune-fp16`` writes
such a log; a whole UNet's tuning may not finish inside one device call, and the lines of what
did finish are still worth keeping.

    python3 bench/autotune_picks.py rows1.log --rows 1 --call 1 >> bench/results/h100x2-rowtune-autotune.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from pathlib import Path

HEADER = re.compile(r"AUTOTUNE (\w+)\((.*)\)$")
CHOICE = re.compile(r"  (\w+) ([0-9.]+) ms")


def picks(text: str) -> Iterator[dict]:
    """One record per AUTOTUNE block, in the order they were tuned."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = HEADER.match(line)
        if not head:
            continue
        choices: list[tuple[str, float]] = []
        for follow in lines[i + 1 :]:
            if follow.startswith("SingleProcess") or HEADER.match(follow):
                break
            if m := CHOICE.match(follow):
                choices.append((m.group(1), float(m.group(2))))
        if not choices:
            continue
        aten = [ms for name, ms in choices if not name.startswith("triton")]
        best_name, best_ms = choices[0]
        yield {
            "kind": "autotune",
            "op": head.group(1),
            "shape": head.group(2),
            "best": best_name,
            "best_ms": best_ms,
            "cublas_ms": aten[0] if aten else None,
            "cublas_above_ms": None if aten else choices[-1][1],
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--rows", type=int, required=True, help="the UNet rows the log's compile ran at")
    ap.add_argument("--call", type=int, required=True, help="which device call wrote the log")
    args = ap.parse_args()
    for pick in picks(args.log.read_text(errors="replace")):
        print(json.dumps({**pick, "rows": args.rows, "call": args.call}))


if __name__ == "__main__":
    main()
