"""The import rules of docs/architecture.md, checked on the source: a room that imports what it
must not fails here, not in a review."""

from __future__ import annotations

import ast

from conftest import ROOT

#: room -> prefixes its modules must never import
FORBIDDEN = {
    "common": ("producer", "worker", "torch", "diffusers"),
    "producer": ("worker", "torch", "diffusers"),
    "worker/output": ("worker.serving", "worker.pipelines", "worker.supervision", "worker.group", "torch"),
    "worker/pipelines": ("worker.serving", "worker.supervision", "worker.group", "producer"),
    "worker/serving": ("worker.group", "producer"),
    "worker/supervision": ("worker.pipelines", "worker.serving", "worker.group", "torch", "diffusers"),
    "worker/group/follower.py": ("worker.group.leader", "rq", "redis"),
}


def imports(path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_every_room_keeps_to_its_imports():
    broken = []
    for room, never in FORBIDDEN.items():
        files = [ROOT / room] if room.endswith(".py") else sorted((ROOT / room).rglob("*.py"))
        assert files, room
        for path in files:
            for name in imports(path):
                if any(name == bad or name.startswith(bad + ".") for bad in never):
                    broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert broken == []


def test_only_the_settings_module_reads_the_environment():
    allowed = {"common/settings.py", "worker/group/comm.py", "worker/group/cli.py"}  # torchrun's own RANK, ...
    readers = []
    for path in sorted((*ROOT.glob("common/*.py"), *ROOT.glob("producer/*.py"), *ROOT.rglob("worker/**/*.py"))):
        text = path.read_text()
        if ("os.environ.get(" in text or "os.getenv(" in text) and str(path.relative_to(ROOT)) not in allowed:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []
