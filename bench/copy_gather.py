"""NCCL's all-gather against a gather on the GPUs' copy engines, beside GEMMs (torchrun, 2+ GPUs).

A ring rank's gather of each layer's keys and values runs beside its compute; NCCL's kernels take
SMs from that compute (``fluxring6``: about 0.1 s of an image's 2.4 s on 2 H200s). torch's
symmetric memory has an all-gather that pulls the peers' buffers with the copy engines
(``symm_mem._low_contention_all_gather``). This measures, with the ring's sizes (one FLUX layer's
keys and values at 1024² on 2 ranks, 28.3 MB a rank; GEMMs of the single block's MLP shape), each
gather alone, the GEMMs alone, and each gather beside the GEMMs, every case one CUDA graph of 57
layers, and whether Inductor compiles the copy-engine gather (``torch.compile``, fullgraph).

    torchrun --standalone --nproc-per-node 2 bench/copy_gather.py --out $OUT/copy_gather.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def timed_graph(fn: Callable[[], object], runs: int, before: Callable[[], object] = dist.barrier) -> float:
    """Median seconds of one replay of ``fn`` captured as one CUDA graph; ``before`` runs ahead of
    each replay (the ranks meet; a caller on one GPU passes a no-op)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(runs):
        before()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=57)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--gemms", type=int, default=2, help="GEMMs beside each layer's gather")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dev = torch.device("cuda")
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD
    name = group.group_name
    lines: list[dict] = []

    def log(**row: object) -> None:
        row = {
            "kind": "copy-gather",
            "gpus": world,
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            **row,
        }
        lines.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)

    elems = 2 * 1 * 24 * 2304 * 128  # keys and values, [2, batch, heads, tokens, dim], bf16
    kv = torch.randn(elems, device=dev, dtype=torch.bfloat16) + rank
    a = torch.randn(2304, 3072, device=dev, dtype=torch.bfloat16)
    w1 = torch.randn(3072, 12288, device=dev, dtype=torch.bfloat16) / 64
    w2 = torch.randn(12288, 3072, device=dev, dtype=torch.bfloat16) / 128
    lc = torch.ops.symm_mem._low_contention_all_gather
    try:
        symm_mem.get_symm_mem_workspace(name, kv.numel() * kv.element_size())
        out = torch.ops._c10d_functional.wait_tensor(lc(kv, name))
        want = torch.cat([t.clone() for t in funcol.all_gather_tensor(kv, 0, group).wait().chunk(world)])
        log(case="ce-correct", ok=bool(torch.equal(out, want)), backend=str(symm_mem.get_backend(dev)))
    except Exception as exc:
        log(case="ce-correct", error=f"{type(exc).__name__}: {exc}"[:600])
        traceback.print_exc()
        ce_ok = False
    else:
        ce_ok = True

    def gemms() -> None:
        for _ in range(args.gemms // 2):
            (a @ w1) @ w2

    def nccl(beside: bool) -> Callable[[], None]:
        def fn() -> None:
            for _ in range(args.layers):
                g = funcol.all_gather_tensor(kv, 0, group)
                if beside:
                    gemms()
                torch.ops._c10d_functional.wait_tensor(g)

        return fn

    def ce(beside: bool, src: torch.Tensor) -> Callable[[], None]:
        def fn() -> None:
            for _ in range(args.layers):
                g = lc(src, name)
                if beside:
                    gemms()
                torch.ops._c10d_functional.wait_tensor(g)

        return fn

    def gemms_only() -> None:
        for _ in range(args.layers):
            gemms()

    cases: dict[str, Callable[[], None]] = {"gemms": gemms_only, "nccl": nccl(False), "nccl+gemms": nccl(True)}
    if ce_ok:
        cases |= {"ce": ce(False, kv), "ce+gemms": ce(True, kv)}
    try:
        sym = symm_mem.empty(elems, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(sym, name)
        sym.copy_(kv)
        cases |= {"ce-symm": ce(False, sym), "ce-symm+gemms": ce(True, sym)}
    except Exception as exc:
        log(case="ce-symm-alloc", error=f"{type(exc).__name__}: {exc}"[:600])
    for label, fn in cases.items():
        try:
            log(
                case=label,
                layers=args.layers,
                gemms=args.gemms,
                mb=round(kv.numel() * 2 / 1e6, 1),
                s=round(timed_graph(fn, args.runs), 5),
            )
        except Exception as exc:
            log(case=label, error=f"{type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
            torch.cuda.synchronize()

    if ce_ok:

        def step(x: torch.Tensor) -> torch.Tensor:
            g = lc(x * 2, name)
            y = (x[: 2304 * 3072].view(2304, 3072) @ w1).sum()
            g = torch.ops._c10d_functional.wait_tensor(g)
            return g.float().sum() + y.float()

        try:
            start = time.perf_counter()
            got = torch.compile(step, fullgraph=True)(kv)
            want = step(kv)
            log(
                case="ce-compiled",
                ok=bool(torch.allclose(got, want, rtol=1e-2)),
                compile_s=round(time.perf_counter() - start, 1),
            )
        except Exception as exc:
            log(case="ce-compiled", error=f"{type(exc).__name__}: {exc}"[:600])
            traceback.print_exc()
    if rank == 0:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in lines)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
