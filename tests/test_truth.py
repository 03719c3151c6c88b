"""Every tool tells the truth after a fault: nothing is called done while an image is missing.

Real worker processes, the tiny model, a real redis-server. Each fault is caught in a state the
test can see (a hold's state file, a job's step), never on the clock. The answers checked are the
shipped tools': ``producer status --json``, ``producer wait``, ``producer verify`` and a burst
worker's exit, all of which read :mod:`common.reconcile`.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, assert_exactly_once, drain, images_under, kill, producer, start_worker, wait_for
from rq.job import Job
from rq.serializers import JSONSerializer

from common.queues import get_queue
from common.reconcile import intermediate_key, left

TTL = "6"  # the shortest heartbeat TTL settings allow: expired executions are lost 6 s after a kill
FLAGS = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "30")


def _prompts(tmp_path: Path, n: int, tag: str = "truth") -> Path:
    rows = tmp_path / f"{tag}.csv"
    rows.write_text("prompt\n" + "".join(f"{tag} prompt {i}\n" for i in range(n)), encoding="utf-8")
    return rows


def _cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The shipped producer as a separate process (its exit code is what a script sees)."""
    cmd = [sys.executable, "-c", "from producer.cli import main; main()", *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _status(env: dict[str, str]) -> dict:
    result = _cli(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _assert_done_and_said(env: dict[str, str], out: Path, images: int) -> None:
    """The images are all there once, and every tool says so."""
    assert_exactly_once(out, images)
    wait = _cli(env, "wait", "--timeout", "60")
    assert wait.returncode == 0 and "drained" in wait.stdout, wait.stdout + wait.stderr
    verify = _cli(env, "verify", out)
    assert verify.returncode == 0 and "clean" in verify.stdout and "not finished" not in verify.stdout, verify.stdout
    assert _status(env)["complete"] is True


def _assert_not_done_said(env: dict[str, str], out: Path) -> None:
    """While an image is missing no tool says done: status, wait (exit 4, not 0) and verify."""
    st = _status(env)
    assert st["complete"] is False and st["jobs"]["pending"] > 0, st
    wait = _cli(env, "wait", "--timeout", "1")
    assert wait.returncode == 4, wait.stdout + wait.stderr
    verify = _cli(env, "verify", out)
    assert verify.returncode != 0 or "not finished" in verify.stdout, verify.stdout


@pytest.mark.worker
@pytest.mark.long
def test_a_job_stranded_as_its_worker_took_it_is_never_called_done(env, conn, tmp_path):
    """Finding 1: a worker killed between taking a job (RQ's intermediate list) and starting it.
    Before, status, wait, verify and a burst worker all said done with the job's images missing.
    The default heartbeat TTL (30 s), as the finding had it: the burst worker is done with the
    other job long before a keeper would have moved the stranded one back."""
    out = tmp_path / "out"
    assert producer("enqueue", _prompts(tmp_path, 4), *FLAGS, "--chunk-size", "2", "--output", out).exit_code == 0
    state, release = tmp_path / "state", tmp_path / "never"
    taker = start_worker({**env, "HELD_TAKEN": str(release), "HELD_STATE": str(state)}, tmp_path / "t.log")
    try:
        wait_for(lambda: state.exists() and state.read_text() == "taken", 240, "the worker holding a job it took")
    finally:
        kill(taker)
    assert conn.llen(intermediate_key("diffq")) == 1
    # starting until the killed worker's last heartbeat is a TTL old, lost after: never done
    place = left(conn, "diffq", ttl=30)
    assert place.starting + place.lost == 1 and place.pending == 2
    _assert_not_done_said(env, out)
    st = _status(env)
    assert st["jobs"]["starting"] + st["jobs"]["lost"] == 1 and st["jobs"]["queued"] == 1, st
    drain(env, tmp_path / "drain.log")
    assert conn.llen(intermediate_key("diffq")) == 0
    _assert_done_and_said(env, out, 4)


@pytest.mark.worker
@pytest.mark.long
def test_a_deleted_output_folder_is_made_again_by_the_same_enqueue(env, conn, tmp_path):
    """Finding 2: the folder did not exist before the first enqueue; the worker made it. Deleted
    whole, the same enqueue makes every image again (the worker recorded the folder)."""
    rows, out = _prompts(tmp_path, 4), tmp_path / "made-by-worker"
    assert producer("enqueue", rows, *FLAGS, "--output", out).exit_code == 0
    drain(env, tmp_path / "a.log")
    assert_exactly_once(out, 4)
    shutil.rmtree(out)
    verify = _cli(env, "verify", out)
    assert verify.returncode != 0 and "producer enqueue makes it again" in verify.stderr
    again = producer("enqueue", rows, *FLAGS, "--output", out)
    assert again.exit_code == 0 and "4 new (4 done earlier but missing on disk)" in again.output, again.output
    drain(env, tmp_path / "b.log")
    _assert_done_and_said(env, out, 4)


@pytest.mark.worker
@pytest.mark.long
def test_verify_checks_one_output_of_a_queue_that_served_several(env, conn, tmp_path):
    """Finding 3: one queue, two output folders. Each verifies clean against its own items; an
    image of the other output's item copied in is called another output's."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert producer("enqueue", _prompts(tmp_path, 2, "a"), *FLAGS, "--output", one).exit_code == 0
    assert producer("enqueue", _prompts(tmp_path, 3, "b"), *FLAGS, "--output", two).exit_code == 0
    drain(env, tmp_path / "w.log")
    for out in (one, two):
        verify = _cli(env, "verify", out)
        assert verify.returncode == 0 and "clean" in verify.stdout, verify.stdout
        assert "in other outputs" in verify.stdout
    stray = images_under(two)[0]
    (one / stray.relative_to(two)).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(stray, one / stray.relative_to(two))
    verify = _cli(env, "verify", one)
    assert verify.returncode == 1 and "done in another output" in verify.stdout, verify.stdout


@pytest.mark.worker
@pytest.mark.long
def test_verify_lists_every_damage_of_an_item(env, conn, tmp_path):
    """Finding 3: an item of two images, one cut and the other without its metadata line: both
    are listed (before, verify moved on at the first damage), and --repair remakes the item."""
    out = tmp_path / "out"
    rows = _prompts(tmp_path, 1)
    assert producer("enqueue", rows, *FLAGS, "--num-images", "2", "--output", out).exit_code == 0
    drain(env, tmp_path / "a.log")
    first, second = images_under(out)
    first.write_bytes(first.read_bytes()[:100])  # cut
    meta = out / "metadata.jsonl"
    kept = [line for line in meta.read_text().splitlines() if str(second.relative_to(out)) not in line]
    meta.write_text("".join(line + "\n" for line in kept))
    verify = _cli(env, "verify", out)
    assert verify.returncode == 1
    assert "1 image(s) of done items missing" in verify.stdout and "1 image(s) of done items with no metadata line" in (
        verify.stdout
    ), verify.stdout
    assert _cli(env, "verify", out, "--repair").returncode == 0
    drain(env, tmp_path / "b.log")
    _assert_done_and_said(env, out, 2)


def _kill_round(env: dict[str, str], conn, tmp_path: Path, round_no: int) -> None:
    """One round of the SIGKILL matrix: four workers, each caught in one phase of a job (taken
    but not started, loading the model, denoising, writing), SIGKILLed together; then the tools
    must not say done, and one burst worker makes every image exactly once."""
    env = {**env, "DIFFQ_HEARTBEAT_TTL": TTL, "OMP_NUM_THREADS": "1"}
    base = tmp_path / f"round{round_no}"
    base.mkdir()
    out = base / "out"
    rows = _prompts(base, 10, f"round{round_no}")  # five jobs: four held, at least one to denoise
    assert producer("enqueue", rows, *FLAGS, "--chunk-size", "2", "--output", out).exit_code == 0
    never = base / "never"
    phases = {"taken": "HELD_TAKEN", "loading": "HELD_LOAD", "writing": "HELD_WRITER"}
    workers, states = {}, {}
    for phase, hold in phases.items():
        states[phase] = base / f"{phase}.state"
        held = {**env, hold: str(never), "HELD_STATE": str(states[phase])}
        workers[phase] = start_worker(held, base / f"{phase}.log", "--name", phase.upper())
    try:
        for phase, state in states.items():
            wait_for(lambda s=state, p=phase: s.exists() and s.read_text() == p, 300, f"a worker {phase}")
        # started once the others hold their jobs, so that some are left for it to denoise
        workers["denoising"] = start_worker(env, base / "denoising.log", "--name", "DENOISING")
        wait_for(lambda: _denoising(conn, "DENOISING"), 300, "a worker denoising", interval=0.05)
    finally:
        for proc in workers.values():
            proc.send_signal(signal.SIGKILL)
        for proc in workers.values():
            kill(proc)
    _assert_not_done_said(env, out)
    drain(env, base / "drain.log")
    _assert_done_and_said(env, out, 10)
    assert conn.llen(intermediate_key("diffq")) == 0
    assert conn.zcard(get_queue("diffq", conn).started_job_registry.key) == 0


def _denoising(conn, worker: str) -> bool:
    for job_id in get_queue("diffq", conn).started_job_registry.get_job_ids(cleanup=False):
        job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        if job.worker_name == worker and (job.meta.get("step") or 0) >= 2:
            return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize(
    # make test-long (CI runs it); make test kills a worker mid-job in test_campaign_state and
    # an export in test_export, and has the writer's and the keeper's parts in tests/test_parts.py
    "round_no",
    [pytest.param(n, marks=pytest.mark.long) for n in range(3)],
)
def test_sigkill_in_every_phase_of_a_job_loses_nothing_and_no_tool_says_done_early(env, conn, tmp_path, round_no):
    _kill_round(env, conn, tmp_path, round_no)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(3, 10))
@pytest.mark.soak
def test_sigkill_matrix_seven_more_rounds(env, conn, tmp_path, round_no):
    """With the three rounds above, ten in ``make test-all``."""
    _kill_round(env, conn, tmp_path, round_no)
