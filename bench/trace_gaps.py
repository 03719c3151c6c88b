"""Where a GPU stood idle inside one profiled call: the gaps between its kernels, copies and
memsets in a ``bench/group.py --profile`` Chrome trace (``rank<N>.trace.json.gz``), by size, and
the largest with the work on either side.

    python3 bench/trace_gaps.py /tmp/prof-r2/rank0.trace.json.gz --label flux-r2-trace >> $OUT/gaps.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

#: gap sizes: each bin's name and upper bound in microseconds
BINS = (("<5us", 5), ("<20us", 20), ("<100us", 100), ("<1ms", 1000), (">=1ms", float("inf")))
GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def gaps(events: list[dict[str, Any]], largest: int = 5) -> dict[str, Any]:
    """Idle time between the GPU's work (the union of its intervals), binned, and the largest gaps."""
    work = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_WORK), key=lambda e: e["ts"])
    start, found = work[0]["ts"], []
    end, before = work[0]["ts"] + work[0]["dur"], work[0]
    for event in work[1:]:
        if event["ts"] > end:
            found.append((event["ts"] - end, end - start, before["name"][:80], event["name"][:80]))
        if event["ts"] + event["dur"] > end:
            end, before = event["ts"] + event["dur"], event
    binned: dict[str, list[float]] = {name: [0.0, 0] for name, _ in BINS}
    for size, *_ in found:
        key = next(name for name, bound in BINS if size < bound)
        binned[key][0] += size / 1e6
        binned[key][1] += 1
    return {
        "span_s": round((end - start) / 1e6, 4),
        "idle_s": round(sum(g[0] for g in found) / 1e6, 4),
        "idle_s_by_gap": {k: round(v[0], 4) for k, v in binned.items()},
        "gaps_by_size": {k: v[1] for k, v in binned.items()},
        "largest": [
            {"us": round(g[0]), "at_ms": round(g[1] / 1000, 1), "after": g[2], "before": g[3]}
            for g in sorted(found, reverse=True)[:largest]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace", type=Path)
    parser.add_argument("--label", required=True)
    args = parser.parse_args()
    with gzip.open(args.trace) as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    print(json.dumps({"kind": "trace-gaps", "label": args.label, **gaps(events)}))


if __name__ == "__main__":
    main()
