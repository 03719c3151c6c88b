"""``make lint``'s docs check (tests/docs_check.py) finds what it is for, and the docs pass it."""

from __future__ import annotations

from docs_check import ROOT, main, problems


def test_the_check_finds_a_dead_link_a_renamed_test_and_a_missing_function(tmp_path):
    page = ROOT / "docs" / "_check_probe.md"
    page.write_text(
        "[gone](nowhere.md) [ok](usage.md)\n"
        "`test_truth.py::test_no_such_test`\n"
        "`producer/verify.py:no_such_function` and `producer/verify.py:verify`\n",
        encoding="utf-8",
    )
    try:
        found = problems(page)
    finally:
        page.unlink()
    assert found == [
        "docs/_check_probe.md:1: link to nowhere.md does not resolve",
        "docs/_check_probe.md:2: test_truth.py has no test_no_such_test",
        "docs/_check_probe.md:3: producer/verify.py defines no no_such_function",
    ]


def test_the_docs_pass_it():
    assert main() == 0
