"""README's Compose block, pasted into a shell on a fresh checkout of a host without GPUs, as a
newcomer follows it: the version check, ``.env`` from the example (the editor sets what README's
comment says, its three CPU lines as README writes them), the data folder, ``up`` with four
workers, ``enqueue``, ``wait``; the dashboard where the ssh tunnel would reach it. Then a second
``up``, the metrics profile's as docs/compose.md writes it: it adds the metrics service and keeps
the four workers (a ``--scale`` given to the first ``up`` was forgotten by the second, which
took one worker away through its 5-minute grace period).

Run by ``make test-compose`` on the image it built. The checkout is a copy of the working tree
in a folder of its own, so the project, ``.env`` and ``./data`` are a newcomer's, not the repo's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT, assert_exactly_once
from docs_blocks import at_site, block, run_block

PASSWORDS = {"REDIS_PASSWORD": "readme-redis-password", "RQ_DASHBOARD_PASSWORD": "readme-dashboard-password"}
#: what docs/compose.md's CPU section adds for a newcomer's own uid (README's lines are read from it)
OWN_USER = {"DIFFQ_UID": str(os.getuid()), "DIFFQ_GID": str(os.getgid())}
#: the second ``up`` (docs/compose.md, Metrics)
METRICS_UP = "docker compose --profile metrics up -d"

EDITOR = """\
import re, sys
path, settings = sys.argv[1], dict(arg.split("=", 1) for arg in sys.argv[2:])
lines = open(path).read().splitlines()
for name, value in settings.items():  # uncomment or replace the line, as a person would
    at = [i for i, line in enumerate(lines) if re.match(rf"#? ?{name}=", line)]
    assert at, f"{name} is not in .env.example"
    lines[at[0]] = f"{name}={value}"
open(path, "w").write("\\n".join(lines) + "\\n")
"""


def checkout(into: Path) -> Path:
    """The working tree's files (tracked and untracked, none that git ignores) in a new folder."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def test_readme_compose_block_runs_as_written_on_a_cpu_host(tmp_path: Path):
    readme_block = block(ROOT / "README.md", "## Compose")
    compose_md = (ROOT / "docs" / "compose.md").read_text()
    cpu_section = compose_md.split("## A host without GPUs", 1)[1].split("\n## ")[0]
    # README's CPU lines as written (one setting a line), not the test's idea of them
    cpu_lines = dict(re.findall(r"^#   ([A-Z_]+)=(.*)$", readme_block, re.M))
    assert set(cpu_lines) == {"COMPOSE_FILE", "DIFFQ_MODEL", "DIFFQ_TORCH_INDEX_URL"}, cpu_lines
    for name in [*cpu_lines, *OWN_USER]:
        assert name in cpu_section, f"docs/compose.md's CPU section no longer mentions {name}"
    for name in PASSWORDS:
        assert name in readme_block, f"README's Compose block no longer says to set {name}"
    assert "DIFFQ_WORKERS=4" in readme_block, "README's Compose block no longer says how many workers"
    assert METRICS_UP in compose_md, "docs/compose.md no longer adds the metrics service this way"
    user, password = "diffq", PASSWORDS["RQ_DASHBOARD_PASSWORD"]
    commands = at_site(
        readme_block,
        {  # the tunnel's far end is this host's 127.0.0.1:9181, where the test is already
            "ssh -L 9181:127.0.0.1:9181 gpu-host": f"curl -fsS -o /dev/null -u {user}:{password} http://127.0.0.1:9181/"
        },
    )
    home = checkout(tmp_path / f"diffq-readme-{os.getpid()}")  # the project: a name no earlier run left volumes under
    (tmp_path / "edit.py").write_text(EDITOR)
    wanted = {**PASSWORDS, **cpu_lines, **OWN_USER, "DIFFQ_WORKERS": "4"}
    settings = " ".join(f"{name}={value}" for name, value in wanted.items())
    editor = tmp_path / "editor"  # `$EDITOR .env`: the newcomer's edits, made by a script
    editor.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "edit.py"} "$1" {settings}\n')
    editor.chmod(0o755)
    env = {**os.environ, "EDITOR": str(editor)}
    for name in [n for n in env if n.startswith(("DIFFQ_", "COMPOSE_", "REDIS_", "RQ_"))]:
        del env[name]  # nothing of the test's own environment stands in for .env
    try:
        ran = run_block(commands, home, env, timeout=1200)
        assert ran.returncode == 0, f"exit {ran.returncode}\n{ran.stdout[-4000:]}\n{ran.stderr[-4000:]}"
        assert "Docker Compose" in ran.stdout + ran.stderr  # the check said what it found
        assert_exactly_once(home / "data" / "out", 13)
        owners = {(p.stat().st_uid, p.stat().st_gid) for p in (home / "data" / "out").rglob("*.png")}
        assert owners == {(os.getuid(), os.getgid())}
        workers = sorted(_running(home, env, "worker"))
        assert len(workers) == 4
        started = time.monotonic()
        again = subprocess.run(METRICS_UP.split(), cwd=home, env=env, capture_output=True, text=True, timeout=900)
        took = time.monotonic() - started
        assert again.returncode == 0, again.stderr[-3000:]
        # the same four workers, none stopped or made again (a replica taken away waits out its
        # 5-minute grace period), and the metrics service beside them
        assert sorted(_running(home, env, "worker")) == workers, f"after {took:.0f} s:\n{again.stderr[-3000:]}"
        assert len(_running(home, env, "metrics")) == 1
    finally:
        subprocess.run(
            ["docker", "compose", "--profile", "metrics", "down", "-v", "--timeout", "30"],
            cwd=home, env=env, capture_output=True, timeout=300,
        )  # fmt: skip


def _running(home: Path, env: dict[str, str], service: str) -> list[str]:
    ps = subprocess.run(
        ["docker", "compose", "ps", "-q", "--status", "running", service], cwd=home, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    return ps.stdout.split()
