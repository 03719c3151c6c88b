"""The import rules of docs/architecture.md, checked on the source: a room that imports what it
must not fails here, not in a review."""

from __future__ import annotations

import ast
import re

from conftest import ROOT


def forbidden() -> dict[str, tuple[str, ...]]:
    """room -> modules it must never import, read from docs/architecture.md's table: the rule the
    page states is the rule this test checks."""
    rules: dict[str, tuple[str, ...]] = {}
    page = (ROOT / "docs" / "architecture.md").read_text()
    text = page.split("## Import rules", 1)[1].split("\n## ", 1)[0]
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rules[cells[0].strip("`")] = tuple(re.findall(r"`([\w.]+)`", cells[2]))
    assert len(rules) >= 7 and all(rules.values()), rules
    return rules


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
    for room, never in forbidden().items():
        files = [ROOT / room] if room.endswith(".py") else sorted((ROOT / room).rglob("*.py"))
        assert files, room
        for path in files:
            for name in imports(path):
                if any(name == bad or name.startswith(bad + ".") for bad in never):
                    broken.append(f"{path.relative_to(ROOT)} imports {name}")
    assert broken == []


def test_only_the_settings_module_reads_the_environment():
    allowed = {"common/settings.py"}  # torchrun's RANK, WORLD_SIZE, MASTER_* too (settings.torchrun)
    readers = []
    for path in sorted((*ROOT.glob("common/*.py"), *ROOT.glob("producer/*.py"), *ROOT.rglob("worker/**/*.py"))):
        text = path.read_text()
        if ("os.environ.get(" in text or "os.getenv(" in text) and str(path.relative_to(ROOT)) not in allowed:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []


def test_no_fault_injection_in_the_product():
    """Faults are test wrappers around the shipped worker (tests/faults.py), never a setting."""
    found = []
    for path in sorted((*ROOT.glob("common/**/*.py"), *ROOT.glob("producer/**/*.py"), *ROOT.glob("worker/**/*.py"))):
        text = path.read_text()
        if re.search(r"\bfault_|DIFFQ_FAULT|InjectedFault", text):
            found.append(str(path.relative_to(ROOT)))
    assert found == []
    assert "DIFFQ_FAULT" not in (ROOT / ".env.example").read_text()


def test_the_rq_overrides_table_lists_every_override():
    """docs/architecture.md's "Where diffq bends RQ" names every method diffq overrides in an
    RQ class, and nothing it no longer overrides, for the rq version it names."""
    import rq
    from rq.job import Job
    from rq.worker import Worker

    from common.queues import LeanJob
    from producer.dashboard import JSONWorker
    from worker.group.leader import GroupWorker
    from worker.serving.rqworker import DiffqWorker

    def overrides(cls: type, base: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("__") and hasattr(base, name)}

    found = {
        (cls.__name__, name)
        for cls, base in ((DiffqWorker, Worker), (GroupWorker, Worker), (LeanJob, Job), (JSONWorker, Worker))
        for name in overrides(cls, base)
    }
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Where diffq bends RQ", 1)[1].split("\n## ", 1)[0]
    assert f"rq {rq.__version__}" in section, f"the table was checked against another rq than {rq.__version__}"
    listed = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \|", section, re.M))
    assert found == listed, (
        f"overridden, not in the table: {found - listed}; in the table, not overridden: {listed - found}"
    )
