"""Compiled graphs kept as files (worker/pipelines/precompiled.py), on a small module on the CPU:
what a file is keyed by, that it is written whole and shared through Redis, that a new process
loads it instead of tracing, and that every failure falls back to the lazy torch.compile with
one line saying why. The tiny pipeline's UNet and decoder take this path in test_speedups.py."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis
import torch

from worker.pipelines import precompiled
from worker.pipelines.precompiled import REMOTE_PREFIX, Precompiled, Store, describe, file_key, fingerprint, install


class Small(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        y = torch.relu(self.inner(x))
        return y * scale if scale is not None else y


def made(width: int = 8) -> Small:
    torch.manual_seed(0)
    return Small(width).requires_grad_(False)


def test_a_signature_names_shapes_dtypes_and_plain_values_not_contents():
    x = torch.ones(2, 8)
    assert describe(((x,), {})) == describe(((torch.zeros(2, 8),), {}))
    others = [((torch.ones(4, 8),), {}), ((x.half(),), {}), ((x,), {"scale": 2.0}), ((x.t(),), {})]
    assert len({describe(((x,), {}))} | {describe(o) for o in others}) == 5


def test_a_file_key_changes_with_the_module_the_levers_and_the_signature():
    base = fingerprint(made()) | {"speedups": "compile-unet"}
    keys = {
        file_key(base, "a"),
        file_key(base, "b"),
        file_key(fingerprint(made(16)) | {"speedups": "compile-unet"}, "a"),
        file_key(base | {"speedups": "compile-unet,fp8"}, "a"),
    }
    assert len(keys) == 4
    assert file_key(base, "a") == file_key(fingerprint(made()) | {"speedups": "compile-unet"}, "a")


def test_fp8_layers_that_differ_only_by_their_buffers_get_different_files():
    """An FP8 linear writing FP8 has an output scale the one writing fp16 lacks: the same classes
    and parameters, another graph (``fp8.ACTIVATIONS``)."""
    from worker.pipelines import fp8

    def quantized(output_amax: float | None) -> Small:
        model = made()
        model.inner = fp8.StaticFP8Linear.replacing(model.inner, 1.0, "tensor", output_amax)
        return model

    assert fingerprint(quantized(None)) != fingerprint(quantized(2.0))
    assert fingerprint(quantized(2.0)) == fingerprint(quantized(3.0))  # a value, not the structure


def test_a_function_set_on_a_layer_and_a_change_to_our_own_layers_code_get_different_files(tmp_path, monkeypatch):
    """FP8's GEGLU computes its GELU in the tanh form (a function set on the instance), and an
    upgrade may change what diffq's own layers compute without changing their parameters: both
    are other graphs. Code of a versioned package (torch, diffusers) is keyed by its version."""
    from diffusers.models.activations import GEGLU

    from worker.pipelines import fp8

    def geglu() -> GEGLU:
        torch.manual_seed(0)
        return GEGLU(8, 8)

    fast = geglu()
    fast.gelu = fp8.tanh_gelu
    assert fingerprint(geglu()) != fingerprint(fast)
    assert fingerprint(geglu()) == fingerprint(geglu())

    source = tmp_path / "own_layer.py"
    body = "import torch\nclass Own(torch.nn.Linear):\n    def forward(self, x):\n        return super().forward(x){}\n"
    monkeypatch.syspath_prepend(str(tmp_path))

    def own(tail: str) -> dict:
        source.write_text(body.format(tail))
        sys.modules.pop("own_layer", None)
        import own_layer

        return fingerprint(own_layer.Own(8, 8))

    assert own("* 2") != own("* 3")
    assert own("* 3") == own("* 3")


def test_files_are_written_whole_readable_by_the_host_and_shared_through_redis(tmp_path, redis_url):
    store = Store(tmp_path / "a", redis_url)
    store.write("k1", lambda path: Path(path).write_bytes(b"graph"))
    assert (tmp_path / "a" / "k1.pt2").read_bytes() == b"graph"
    assert stat.S_IMODE((tmp_path / "a" / "k1.pt2").stat().st_mode) == 0o644
    assert redis.Redis.from_url(redis_url).get(REMOTE_PREFIX + "k1") == b"graph"

    def broken(path: str) -> None:
        Path(path).write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.write("k2", broken)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["k1.pt2"]  # no half file, no temp file

    new_host = Store(tmp_path / "b", redis_url)
    assert new_host.read("k1") == b"graph" and (tmp_path / "b" / "k1.pt2").read_bytes() == b"graph"
    assert new_host.read("k2") is None


def test_a_store_whose_redis_is_down_keeps_its_files_on_this_host(tmp_path, caplog):
    store = Store(tmp_path, "redis://127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        assert store.read("k") is None
        store.write("k", lambda path: Path(path).write_bytes(b"graph"))
    assert store.read("k") == b"graph"
    assert next(r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()).startswith(
        "compiled graphs: the shared Redis at redis://127.0.0.1:1/0 did not answer"
    )
    assert len(caplog.records) == 1  # said once; later calls do not try again


def test_a_memory_probe_runs_eagerly_and_compiles_nothing(tmp_path, monkeypatch):
    module, x = made(), torch.randn(2, 8)
    expected = module(x)
    monkeypatch.setattr(precompiled, "compile_ahead", lambda *a: pytest.fail("compiled under force_eager"))
    install(module, Store(tmp_path), {})
    with torch.compiler.set_stance("force_eager"):
        assert torch.equal(module(x), expected)
    assert not list(tmp_path.iterdir())


def test_a_failed_precompile_falls_back_to_torch_compile_and_says_why(tmp_path, monkeypatch, caplog):
    module, x = made(), torch.randn(2, 8)
    expected = module(x)
    compiled: list[torch.nn.Module] = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: compiled.append(self))

    def refuse(*args):
        raise TypeError("cannot pickle '_thread.RLock' object")

    monkeypatch.setattr(precompiled, "compile_ahead", refuse)
    install(module, Store(tmp_path), {})
    with caplog.at_level(logging.WARNING, logger="diffq.worker"):
        assert torch.equal(module(x), expected)
    assert compiled == [module] and not isinstance(module.__dict__.get("forward"), Precompiled)
    message = caplog.records[-1].getMessage()
    assert message.startswith("compiled graphs: Small runs under lazy torch.compile instead (TypeError: cannot pickle")
    assert "test_precompiled.py:" in message  # where it was raised


LOAD = textwrap.dedent(
    """
    import logging, sys, torch
    from torch._dynamo.utils import counters
    sys.path.insert(0, {tests!r})
    from test_precompiled import made
    from worker.pipelines.precompiled import Store, install
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    module, store = made(), Store(__import__("pathlib").Path({folder!r}))
    install(module, store, {{}})
    with torch.no_grad():
        out = module(torch.ones(2, 8), scale=3.0)
    print("RESULT", store.compiled, store.loaded, counters["stats"]["unique_graphs"], out.sum().item())
    """
)


def run_process(folder: Path) -> tuple[list[str], str]:
    code = LOAD.format(tests=str(Path(__file__).parent), folder=str(folder))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder.parent / "inductor")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("RESULT ")[1].split(), done.stderr


@pytest.mark.slow
@pytest.mark.long
def test_a_new_process_loads_the_file_instead_of_tracing_and_a_damaged_file_is_compiled_again(tmp_path):
    expected = made()(torch.ones(2, 8), scale=3.0).sum().item()
    folder = tmp_path / "precompiled"
    (compiled, loaded, graphs, total), _ = run_process(folder)
    assert (compiled, loaded) == ("1", "0") and float(total) == pytest.approx(expected)
    (compiled, loaded, graphs, total), log = run_process(folder)
    assert (compiled, loaded, graphs) == ("0", "1", "0") and float(total) == pytest.approx(expected)
    assert "loaded from" in log and "(no trace)" in log

    [file] = folder.iterdir()
    file.write_bytes(file.read_bytes()[:100])  # a file cut short (a full disk, a killed copy)
    (compiled, loaded, graphs, total), log = run_process(folder)
    assert (compiled, loaded) == ("1", "0") and float(total) == pytest.approx(expected)
    assert "could not be loaded" in log and "compiling again" in log
    (compiled, loaded, _, _), _ = run_process(folder)
    assert (compiled, loaded) == ("0", "1")  # the file written over is whole
