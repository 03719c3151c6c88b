"""The ``persistent-norms`` lever (worker/pipelines/reductions.py): which reductions the compiler
writes in one pass, and that the compile caches tell the two ways apart.

The choice is Inductor's own, asked the way its Triton code generator asks it, with the graph's
size arithmetic; the CPU has no Triton kernels to look at, so the generated code itself is
checked on the GPU (docs/benchmarks.md: normalization 30.98 -> 26.39 ms of an H100 UNet call)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import sympy
import torch
import torch.compiler.config as compiler_config
from torch._inductor.choices import InductorChoices
from torch._inductor.runtime.hints import ReductionHint
from torch._inductor.sizevars import SizeVarAllocator
from torch._inductor.virtualized import V

from worker.pipelines import reductions
from worker.pipelines.speedups import Speedups, apply
from worker.pipelines.warm import WarmPipelines


def persistent(elements: int, hint: ReductionHint = ReductionHint.INNER) -> bool:
    """Whether Inductor writes a reduction of ``elements`` a row in one pass."""
    features = SimpleNamespace(
        get_reduction_hint=lambda: hint, reduction_numel=sympy.Integer(elements), numel=sympy.Integer(16384)
    )
    with V.set_graph_handler(SimpleNamespace(sizevars=SizeVarAllocator())):
        return InductorChoices().should_use_persistent_reduction(features, False)


@pytest.fixture
def compiler_defaults():
    with compiler_config.patch(cache_key_tag=""):
        yield
        reductions.restore()


def test_sdxls_layernorm_rows_are_reduced_in_one_pass_only_when_widened(compiler_defaults):
    assert persistent(1024) and not persistent(1280)  # the compiler's own limit
    assert reductions.widen()
    assert persistent(1280) and persistent(2048) and not persistent(4096)
    assert not persistent(1280, ReductionHint.OUTER)  # columns (GroupNorm's split) keep their choice
    reductions.restore()
    assert persistent(1024) and not persistent(1280)


def test_the_compile_caches_key_tells_widened_graphs_apart_and_keeps_the_users_tag(compiler_defaults):
    compiler_config.cache_key_tag = "team-a"
    reductions.widen()
    assert compiler_config.cache_key_tag == "team-a,diffq-persistent-2048"
    reductions.widen(1536)  # again: the limit changes, the tag follows, nothing doubles
    assert compiler_config.cache_key_tag == "team-a,diffq-persistent-1536" and persistent(1280)
    assert not persistent(2048)
    reductions.restore()
    assert compiler_config.cache_key_tag == "team-a"


def test_the_lever_widens_the_compilers_choice_and_leaving_it_out_restores_it(compiler_defaults, cache_dir):
    loaded, _ = WarmPipelines(str(cache_dir), device="cpu").get("tiny")
    lever = Speedups.parse("vae-fp16,persistent-norms", torch.device("cpu"))
    assert "persistent-norms" in lever.describe()  # so in the precompiled files' key
    apply(loaded.pipe, lever)
    assert persistent(1280) and "diffq-persistent" in compiler_config.cache_key_tag
    apply(loaded.pipe, Speedups.parse("vae-fp16", torch.device("cpu")))
    assert not persistent(1280) and compiler_config.cache_key_tag == ""


def test_auto_beside_a_lever_is_the_devices_defaults_and_that_lever(monkeypatch):
    from common.errors import ConfigError
    from common.presets import CUDA_DEFAULT_SPEEDUPS

    assert Speedups.parse("auto,persistent-norms", torch.device("cuda")).levers == {
        *CUDA_DEFAULT_SPEEDUPS,
        "persistent-norms",
    }
    assert Speedups.parse("auto,persistent-norms", torch.device("cpu")).levers == {"persistent-norms"}
    with pytest.raises(ConfigError, match=r"unknown lever\(s\) persistent-norm;"):
        Speedups.parse("auto,persistent-norm", torch.device("cuda"))
