"""``make lint``'s docs check (tests/docs_check.py) finds what it is for, and the docs pass it."""

from __future__ import annotations

from docs_check import ROOT, main, problems


def _problems_of(text: str) -> list[str]:
    """The check's findings on a page of ``text`` placed in docs/ (relative links resolve there)."""
    page = ROOT / "docs" / "_check_probe.md"
    page.write_text(text, encoding="utf-8")
    try:
        return problems(page)
    finally:
        page.unlink()


def test_the_check_finds_a_dead_link_a_renamed_test_and_a_missing_function(tmp_path):
    found = _problems_of(
        "[gone](nowhere.md) [ok](usage.md)\n"
        "`test_truth.py::test_no_such_test`\n"
        "`producer/verify.py:no_such_function` and `producer/verify.py:verify`\n"
    )
    assert found == [
        "docs/_check_probe.md:1: link to nowhere.md does not resolve",
        "docs/_check_probe.md:2: test_truth.py has no test_no_such_test",
        "docs/_check_probe.md:3: producer/verify.py defines no no_such_function",
    ]


def test_the_check_finds_a_variable_nothing_reads_any_more():
    """A variable retired for a flag (DIFFQ_RETRY_BACKOFF became ``--retry-backoff``) left in a
    page tells a user to set what nothing reads."""
    found = _problems_of("`DIFFQ_HEARTBEAT_TTL` and `DIFFQ_RETRY_BACKOFF`\n")
    assert found == [
        "docs/_check_probe.md:1: DIFFQ_RETRY_BACKOFF is read by nothing (a retired variable: name its flag)"
    ]


def test_the_check_finds_a_link_to_a_heading_that_is_not_there():
    """A renamed heading leaves its links pointing nowhere: the anchor is checked, by GitHub's rule."""
    found = _problems_of(
        "# A `code` heading (here)\n[ok](#a-code-heading-here) [ok](benchmarks.md#fp8---precision-fp8)\n"
        "[gone](benchmarks.md#xdit-worker-groups-one-image-on-several-gpus-benchgrouppy-benchgroup_queuepy) "
        "[gone](#nope)\n"
    )
    assert found == [
        "docs/_check_probe.md:3: link to benchmarks.md#xdit-worker-groups-one-image-on-several-gpus-benchgrouppy-"
        "benchgroup_queuepy: benchmarks.md has no heading with that anchor",
        "docs/_check_probe.md:3: link to #nope: _check_probe.md has no heading with that anchor",
    ]


def test_the_lever_and_settings_tables_follow_the_code(monkeypatch):
    """A lever or variable the code gains and the reference tables lack (or the reverse) is one
    line of ``make lint``: the tables cannot drift from common/presets.py and common/settings.py."""
    from docs_check import reference_tables

    from common import presets, settings

    assert reference_tables() == []
    monkeypatch.setitem(presets.SPEEDUP_LEVERS, "new-lever", "a lever with no row")
    monkeypatch.delitem(settings.ENV_NAMES, "queue")
    found = reference_tables()
    assert len(found) == 2
    assert "'## Levers' lacks ['new-lever'], has [] the code has not" in found[0]
    assert "'## Settings' lacks [], has ['DIFFQ_QUEUE'] the code has not" in found[1]


def test_the_docs_pass_it():
    assert main() == 0


def _figures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_figures", ROOT / "bench" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_figure_typed_by_hand_fails_the_check_and_make_docs_rewrites_it(tmp_path):
    figures = _figures()
    assert figures.problems() == []  # every figure in the pages matches bench/results
    page = tmp_path / "page.md"
    page.write_text("fp8 made <!-- fig fp8.h100.fp8 -->1.5<!-- /fig --> img/s; <!-- fig nope -->1<!-- /fig -->\n")
    figures.ROOT = tmp_path
    found = figures.problems([page])
    assert found == [
        "page.md:1: fp8.h100.fp8 says '1.5', bench/results gives '1.206' (make docs)",
        "page.md:1: no figure named nope in bench/figures.py",
    ]
    page.write_text("fp8 made <!-- fig fp8.h100.fp8 -->1.5<!-- /fig --> img/s\n")
    assert figures.write([page]) == 1
    assert page.read_text() == "fp8 made <!-- fig fp8.h100.fp8 -->1.206<!-- /fig --> img/s\n"
