"""bench/ imports product internals (the worker's cache, the job function, the ledger...): each
script is imported here, so a rename in the product breaks this test, not a benchmark run on a
lent GPU. A script that runs at import (a torchrun entry without a ``__main__`` guard) is
compiled instead."""

from __future__ import annotations

import importlib.util
import py_compile
import sys

import pytest
from conftest import ROOT

SCRIPTS = sorted((ROOT / "bench").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    if 'if __name__ == "__main__"' not in script.read_text(encoding="utf-8"):
        py_compile.compile(str(script), doraise=True)
        return
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
