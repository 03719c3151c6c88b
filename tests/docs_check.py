"""``make lint``'s check of the docs against the tree: every relative link resolves, and every
test a page names (``test_file.py::test_name``) and every function it names in a file
(``path/file.py:function``) exists. Prints one line per problem, ``FILE:LINE: what``, and exits 1
if there is any. Run as ``python tests/docs_check.py`` from the repository root."""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
TEST = re.compile(r"\b(test_\w+\.py)::(test_\w+)")
FUNCTION = re.compile(r"`((?:common|producer|worker)/[\w/]+\.py):(\w+)`")


@cache
def _names(path: Path) -> frozenset[str]:
    """Functions, classes and methods defined in ``path`` (and module-level assignments)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _test_file(name: str) -> Path | None:
    found = sorted(ROOT.joinpath("tests").rglob(name))
    return found[0] if found else None


def problems(page: Path) -> list[str]:
    out = []
    rel = page.relative_to(ROOT)
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target in LINK.findall(line):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                out.append(f"{rel}:{number}: link to {target} does not resolve")
        for file, test in TEST.findall(line):
            where = _test_file(file)
            if where is None:
                out.append(f"{rel}:{number}: {file} is not a test file")
            elif test not in _names(where):
                out.append(f"{rel}:{number}: {file} has no {test}")
        for file, name in FUNCTION.findall(line):
            path = ROOT / file
            if not path.exists():
                out.append(f"{rel}:{number}: {file} does not exist")
            elif name not in _names(path):
                out.append(f"{rel}:{number}: {file} defines no {name}")
    return out


def main() -> int:
    found = [line for page in PAGES if page.exists() for line in problems(page)]
    print("\n".join(found) or f"docs: {len(PAGES)} pages, links, tests and functions named all resolve")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
