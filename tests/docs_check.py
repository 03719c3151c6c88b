"""``make lint``'s check of the docs against the tree: every relative link resolves (a ``#anchor``
into a Markdown page too, by GitHub's rule for heading anchors), every test a page names
(``test_file.py::test_name``) and every function it names in a file (``path/file.py:function``)
exists, every ``DIFFQ_*`` variable it names is read by something, and docs/ stays under
:data:`DOCS_WORDS` words (a guide, not a log: a new finding replaces an old one). Prints one line per
problem, ``FILE:LINE: what``, and exits 1 if there is any. Run as ``python tests/docs_check.py``
from the repository root."""

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
VARIABLE = re.compile(r"\bDIFFQ_[A-Z0-9_]+\b")
#: docs/'s pages together hold fewer words than this (counted as ``wc -w`` counts them)
DOCS_WORDS = 30_000


@cache
def _variables_read() -> frozenset[str]:
    """Every ``DIFFQ_*`` name something reads: the product's settings, the tests' and the
    bench's own, and compose's interpolations (``.env.example`` is a page of its own, not a reader)."""
    readers = [ROOT / "compose.yaml", *ROOT.glob("compose.*.yaml"), ROOT / "Dockerfile", ROOT / "Makefile"]
    for package in ("common", "worker", "producer", "tests", "bench", "examples", ".ci"):
        readers += [p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".sh", ".yaml", "")]
    readers = [p for p in readers if p.name != "test_docs_check.py"]  # its probes name retired ones
    return frozenset(
        name for path in readers if path.is_file() for name in VARIABLE.findall(path.read_text(errors="replace"))
    )


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


@cache
def _anchors(path: Path) -> frozenset[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading suffixed ``-1``, ``-2``, ... (fenced code is not headings)."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", text.replace("`", "")).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return frozenset(found)


def _test_file(name: str) -> Path | None:
    found = sorted(ROOT.joinpath("tests").rglob(name))
    return found[0] if found else None


def problems(page: Path) -> list[str]:
    out = []
    rel = page.relative_to(ROOT)
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for target in LINK.findall(line):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                out.append(f"{rel}:{number}: link to {target} does not resolve")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                out.append(f"{rel}:{number}: link to {target}: {linked.name} has no heading with that anchor")
        for file, test in TEST.findall(line):
            where = _test_file(file)
            if where is None:
                out.append(f"{rel}:{number}: {file} is not a test file")
            elif test not in _names(where):
                out.append(f"{rel}:{number}: {file} has no {test}")
        for name in VARIABLE.findall(line):
            if name not in _variables_read():
                out.append(f"{rel}:{number}: {name} is read by nothing (a retired variable: name its flag)")
        for file, name in FUNCTION.findall(line):
            path = ROOT / file
            if not path.exists():
                out.append(f"{rel}:{number}: {file} does not exist")
            elif name not in _names(path):
                out.append(f"{rel}:{number}: {file} defines no {name}")
    return out


def _first_column(page: Path, heading: str) -> tuple[int, list[str]]:
    """The back-quoted names in the first column of the table under ``heading``, and its line."""
    lines = page.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading) if heading in lines else -1
    names = []
    for line in lines[start + 1 :] if start >= 0 else []:
        if line.startswith("#"):
            break
        cell = re.match(r"\| `([^`]+)` \|", line)
        if cell:
            names.append(cell.group(1))
    return start + 1, names


def reference_tables() -> list[str]:
    """docs/usage.md's lever and settings tables against the code: every lever of
    ``SPEEDUP_LEVERS`` and ``RETIRED_LEVERS`` in its table, every variable of ``ENV_NAMES`` in
    the other, and nothing else (a lever or variable added or removed changes its table)."""
    sys.path.insert(0, str(ROOT))
    from common.presets import RETIRED_LEVERS, SPEEDUP_LEVERS
    from common.settings import ENV_NAMES

    page = ROOT / "docs" / "usage.md"
    out = []
    for heading, want in (
        ("## Levers", [*SPEEDUP_LEVERS, *RETIRED_LEVERS]),
        ("## Settings", list(ENV_NAMES.values())),
    ):
        line, names = _first_column(page, heading)
        if sorted(names) != sorted(want):
            missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
            out.append(
                f"docs/usage.md:{line}: the table under {heading!r} lacks {missing}, has {extra} the code has not"
            )
    return out


def too_long() -> list[str]:
    words = sum(len(page.read_text(encoding="utf-8").split()) for page in (ROOT / "docs").glob("*.md"))
    return [f"docs/: {words:,} words, at most {DOCS_WORDS - 1:,}: shorten a page"] if words >= DOCS_WORDS else []


def main() -> int:
    found = [line for page in PAGES if page.exists() for line in problems(page)] + reference_tables() + too_long()
    print("\n".join(found) or f"docs: {len(PAGES)} pages, links, tests and functions named all resolve")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
