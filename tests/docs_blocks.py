"""The command blocks of README and docs, for the tests that run them as a newcomer would.

A newcomer copies a fenced block under a heading and pastes it into a shell. The tests do the
same: :func:`block` returns the block's text as it is on the page, and :func:`at_site` swaps the
few words that name the reader's own site (a host name, a password, a shared folder) for the
test's, failing when a word is no longer on the page, so a docs edit cannot leave a test running
yesterday's commands. Everything else runs as written, in ``bash -e``.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.M | re.S)


def block(page: Path, heading: str, index: int = 0) -> str:
    """The ``index``-th fenced block of the section whose heading line is ``heading``."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == heading]
    assert starts, f"{page.name} has no heading {heading!r}"
    level = len(heading) - len(heading.lstrip("#"))
    section, fenced = [], False
    for line in lines[starts[0] + 1 :]:
        fenced ^= line.startswith("```")
        depth = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < depth <= level and line[depth : depth + 1] == " ":
            break  # the next heading of the same or a higher level
        section.append(line)
    blocks = FENCE.findall("".join(section))
    assert len(blocks) > index, f"{page.name}: {heading!r} has {len(blocks)} command blocks, not {index + 1}"
    return blocks[index]


def at_site(commands: str, site: dict[str, str]) -> str:
    """``commands`` with each word of ``site`` replaced; every word must be there."""
    for word, replacement in site.items():
        assert word in commands, f"the docs no longer say {word!r}: update the test's site words\n{commands}"
        commands = commands.replace(word, replacement)
    return commands


def run_block(commands: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``commands`` in ``bash -e``, one after another as if typed, stdin closed.

    Not fed through bash's stdin: a command that reads its stdin (``docker compose run``
    attaches it) would swallow the lines after it, which a person typing them never sees.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as script:
        script.write(commands)
        script.flush()
        return subprocess.run(
            ["bash", "-e", script.name],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
