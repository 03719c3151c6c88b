"""The suite stops when asked: Ctrl-C or SIGTERM ends a pytest run within seconds, and nothing
it started (servers, workers) outlives it, even when pytest itself is SIGKILLed
(tests/lifeline.py). Each case runs tests/stop_target.py in a pytest of its own and signals it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

#: seconds from the signal to pytest's exit: its teardown stops a worker, a moto and a redis-server
STOPS_WITHIN_S = 30


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "case"),
    [
        pytest.param(signal.SIGINT, "servers_and_a_worker_process", marks=pytest.mark.long),
        pytest.param(signal.SIGTERM, "a_worker_in_pytests_own_process", marks=pytest.mark.long),
        (signal.SIGKILL, "servers_and_a_worker_process"),
    ],
)
def test_a_signalled_session_stops_and_takes_everything_it_started_with_it(signum, case, tmp_path):
    pids = tmp_path / "pids.json"
    env = {**os.environ, "STOP_TARGET_PIDS": str(pids)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "inner")]
    with open(tmp_path / "inner.log", "wb") as log:
        inner = subprocess.Popen(
            [*command, f"tests/stop_target.py::test_{case}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for(pids.exists, 240, f"the inner session to start its test ({tmp_path / 'inner.log'})")
        started = json.loads(pids.read_text())
        time.sleep(0.5)  # inside its wait: the worker a real test would be waiting on
        signalled = time.monotonic()
        inner.send_signal(signum)
        code = inner.wait(STOPS_WITHIN_S + 60)
        took = time.monotonic() - signalled
    finally:
        if inner.poll() is None:
            inner.kill()
    output = (tmp_path / "inner.log").read_text(errors="replace")
    assert took < STOPS_WITHIN_S, f"pytest took {took:.1f}s to stop:\n{output[-3000:]}"
    assert code != 0 and "passed" not in output.splitlines()[-1:]
    if signum != signal.SIGKILL:
        assert "KeyboardInterrupt" in output, output[-3000:]
    wait_for(lambda: not any(running(pid) for pid in started.values()), 30, f"{started} to go with pytest")
