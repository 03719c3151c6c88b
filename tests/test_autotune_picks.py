"""bench/autotune_picks.py reads Inductor's autotuning printout; the figures in docs/groups.md
about which GEMMs cuBLAS leaves slow at one row come from it, so its reading is pinned here on
the printout's real form (copied from a device log, shortened to three choices)."""

from __future__ import annotations

import importlib.util
import sys

from conftest import ROOT

LOG = """\
AUTOTUNE addmm(1024x1280, 1024x5120, 5120x1280)
strides: [0, 1], [5120, 1], [1, 5120]
dtypes: torch.float16, torch.float16, torch.float16
  triton_mm_3100 0.0344 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=64, BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4
  triton_mm_3101 0.0401 ms 85.8% ACC_TYPE='tl.float32', BLOCK_K=32, BLOCK_M=64, BLOCK_N=128, num_stages=4, num_warps=8
  addmm 0.0678 ms 50.8%
SingleProcess AUTOTUNE benchmarking takes 14.0937 seconds and 0.0003 seconds precompiling for 22 choices
E1127 12:31:15.329000 955 torch/_inductor/select_algorithm.py:3924] [0/0] Runtime error during autotuning:
AUTOTUNE mm(1024x1280, 1280x1280)
strides: [1280, 1], [1, 1280]
dtypes: torch.float16, torch.float16
  triton_mm_1100 0.0137 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=64, BLOCK_M=64, BLOCK_N=128, num_stages=3, num_warps=4
  triton_mm_1101 0.0213 ms 64.3% ACC_TYPE='tl.float32', BLOCK_K=128, BLOCK_M=64, BLOCK_N=64, num_stages=3, num_warps=4
AUTOTUNE addmm(1x320, 1x1280, 1280x320)
"""


def test_each_tuned_product_gives_its_best_kernel_and_cublas_or_a_bound_for_it(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_autotune_picks", ROOT / "bench" / "autotune_picks.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)

    picks = list(module.picks(LOG))

    assert [(p["op"], p["shape"]) for p in picks] == [
        ("addmm", "1024x1280, 1024x5120, 5120x1280"),
        ("mm", "1024x1280, 1280x1280"),
    ]  # the last header has no choices under it (the log was cut): no record
    assert picks[0] == {
        "kind": "autotune",
        "op": "addmm",
        "shape": "1024x1280, 1024x5120, 5120x1280",
        "best": "triton_mm_3100",
        "best_ms": 0.0344,
        "cublas_ms": 0.0678,
        "cublas_above_ms": None,
    }
    # cuBLAS not among the choices shown: the slowest shown is a lower bound for it
    assert (picks[1]["cublas_ms"], picks[1]["cublas_above_ms"]) == (None, 0.0213)
