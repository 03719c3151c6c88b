"""The import rules of docs/architecture.md, checked on the source: a room that imports what it
must not fails here, not in a review."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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
    import importlib
    import inspect
    import pkgutil

    import rq
    from rq.job import Job
    from rq.queue import Queue
    from rq.worker import Worker
    from rq.worker.base import BaseWorker

    def overrides(cls: type, base: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("__") and hasattr(base, name)}

    # every class of the product that extends one of RQ's, found, not listed by hand
    found = set()
    for package in ("common", "producer", "worker"):
        for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for cls in vars(module).values():
                if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                    continue
                # a worker is any of RQ's worker classes; what it overrides is what rq.Worker has
                for kind, base in ((BaseWorker, Worker), (Job, Job), (Queue, Queue)):
                    if issubclass(cls, kind):
                        found |= {(cls.__name__, name) for name in overrides(cls, base)}
    assert ("GroupWorker", "handle_job_failure") in found and ("LeanJob", "to_dict") in found  # the walk works
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Where diffq bends RQ", 1)[1].split("\n## ", 1)[0]
    assert f"rq {rq.__version__}" in section, f"the table was checked against another rq than {rq.__version__}"
    listed = set(re.findall(r"^\| `(\w+)` \| `(\w+)` \|", section, re.M))
    assert found == listed, (
        f"overridden, not in the table: {found - listed}; in the table, not overridden: {listed - found}"
    )


#: the libraries whose settings and private names the product may touch (the scan's roots)
LIBRARIES = {
    "torch",
    "rq",
    "rq_dashboard",
    "huggingface_hub",
    "diffusers",
    "transformers",
    "peft",
    "redis",
    "xfuser",
    "os",
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _first_private(name: str) -> str | None:
    segments = name.split(".")
    for i, segment in enumerate(segments):
        if segment.startswith("_") and not segment.startswith("__"):
            return ".".join(segments[: i + 1])
    return None


def process_wide(path: Path) -> set[tuple[str, str]]:
    """(what, kind) of one module: its writes to the environment or to a library's attributes,
    and the private names of libraries it reaches."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # local name -> the library path it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARIES:
                    bound[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def resolved(node: ast.AST) -> str | None:
        name = _dotted(node)
        root, _, rest = (name or "").partition(".")
        return bound[root] + ("." + rest if rest else "") if root in bound else None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found |= {
                (_first_private(m), "private") for m in modules if m.split(".")[0] in LIBRARIES and _first_private(m)
            }
        elif isinstance(node, ast.Attribute):
            name = resolved(node)
            if name and not name.startswith("os.") and _first_private(name):
                found.add((_first_private(name), "private"))
            if node.attr == "_stopped_job_id":  # RQ's, read through the worker's own self
                found.add(("rq.Worker._stopped_job_id", "private"))
        if isinstance(node, ast.Assign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Subscript) and _dotted(target.value) == "os.environ":
                    found.add((f"os.environ[{ast.literal_eval(target.slice)}]", "write"))
                elif isinstance(target, ast.Attribute) and resolved(target):
                    found.add((resolved(target), "write"))
    return found


def test_process_wide_state_and_private_apis_are_all_listed():
    found = {
        (str(path.relative_to(ROOT)), what, kind)
        for room in ("common", "producer", "worker")
        for path in sorted((ROOT / room).rglob("*.py"))
        for what, kind in process_wide(path)
    }
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Process-wide state and other libraries' private parts", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w/.]+)` \| `([^`]+)` \| (\w+) \|", section, re.M))
    assert found == listed, (
        f"in the code, not in the table: {found - listed}; in the table, not in the code: {listed - found}"
    )
