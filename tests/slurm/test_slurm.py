"""Workers as Slurm jobs, on a real Slurm: ``munged``, ``slurmctld`` and ``slurmd`` started on
this machine (one node, CPUs only, a config written here in a temp folder, stopped at the end),
the shipped ``deploy/slurm/diffq-workers.sbatch`` submitted with ``sbatch``, and Slurm's own
ways of stopping: ``scancel`` mid-job, a time limit, then a new submission (a job array of two
single workers) that finishes the campaign. Every image exactly once with one metadata line.

Run by ``make test-slurm`` (which installs Debian's slurmctld, slurmd, slurm-client and munge
when they are missing). Not covered here: GPU GRES binding, several nodes, Apptainer.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, SLOW, alive, assert_exactly_once, free_port, producer, wait_for
from docs_blocks import at_site, block, run_block
from rq.registry import FailedJobRegistry, StartedJobRegistry

SBATCH = ROOT / "deploy" / "slurm" / "diffq-workers.sbatch"
#: states of a job that has ended (scontrol keeps ended jobs for MinJobAge, 300 s by default)
ENDED = {"COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL"}

#: docs/slurm.md's one-machine Slurm, the block a reader pastes; only its site words are the test's
ONE_MACHINE = "## A Slurm on one machine, to try it"


@dataclass
class Slurm:
    dir: Path
    env: dict[str, str]

    def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(args, env=env or self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
        return done.stdout.strip()

    def sbatch(self, env: dict[str, str], *options: str) -> str:
        return self.run("sbatch", "--parsable", f"--chdir={ROOT}", *options, str(SBATCH), env={**self.env, **env})

    def states(self, job: str) -> list[str]:
        """The state of the job, or of each task of a job array."""
        lines = self.run("scontrol", "show", "job", "-o", job).splitlines()
        return [line.split("JobState=", 1)[1].split()[0] for line in lines if "JobState=" in line]

    def ended(self, job: str) -> str | None:
        """The state once every task of the job has ended ("COMPLETED,COMPLETED" for two)."""
        states = self.states(job)
        return ",".join(states) if states and all(s in ENDED for s in states) else None


def _pids(folder: Path) -> list[int]:
    return [int(p.read_text().split()[0]) for p in folder.glob("*.pid") if p.read_text().strip()]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if not shutil.which(tool)]
    assert not missing, f"{', '.join(missing)} missing: `make test-slurm` installs Debian's slurm-wlm and munge"
    folder = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname().split(".")[0]
    start = at_site(
        block(ROOT / "docs" / "slurm.md", ONE_MACHINE),
        {
            "/var/tmp/slurm": str(folder),
            "myhost": host,
            "SlurmctldPort=6817": f"SlurmctldPort={free_port()}",
            "SlurmdPort=6818": f"SlurmdPort={free_port()}",
            "CPUs=2": f"CPUs={os.cpu_count() or 2}",
        },
    )
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    started = run_block(start, ROOT, env, timeout=120)
    assert started.returncode == 0, f"docs/slurm.md's one-machine block: {started.stderr[-2000:]}"
    cluster = Slurm(folder, env)
    try:
        wait_for(
            lambda: cluster.run("sinfo", "-h", "-o", "%T").startswith("idle"),
            120,
            f"the node to come up (logs in {folder})",
        )
        yield cluster
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True, timeout=60)
        # the jobs end before the daemons: a step daemon whose slurmd went first outlived the test
        _until_no_jobs(env, 60)
        _stop(_pids(folder), 30)


def _until_no_jobs(env: dict[str, str], timeout: float) -> None:
    """Wait (at most ``timeout``) until the queue is empty or the controller does not answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=60)
        if queue.returncode != 0 or not queue.stdout.strip():
            return
        time.sleep(0.5)


def _stop(pids: list[int], timeout: float) -> None:
    """SIGTERM each daemon, then SIGKILL any still there after ``timeout``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a daemon that already went
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def job_env(redis_url: str, cache_dir: Path, logs: Path, **extra: str) -> dict[str, str]:
    """What a user exports before sbatch: the queue's Redis, the cache, the worker command."""
    return {
        "REDIS_URL": redis_url,
        "DIFFQ_CACHE": str(cache_dir),
        "DIFFQ_WORKER": f"{sys.executable} -m worker",  # the shipped CLI of this checkout
        "DIFFQ_GPUS": "cpu",
        "DIFFQ_SLURM_LOGS": str(logs),
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def test_workers_stopped_by_scancel_and_a_time_limit_lose_nothing_and_a_new_job_finishes(
    slurm, redis_url, conn, cache_dir, tmp_path
):
    images = 40
    path = tmp_path / "prompts.csv"
    path.write_text("prompt\n" + "".join(f"slurm prompt {i}\n" for i in range(images)))
    out = tmp_path / "out"
    queued = producer("enqueue", path, *SLOW, "--chunk-size", "2", "--output", out, "--redis-url", redis_url)
    assert queued.exit_code == 0, queued.output
    logs = tmp_path / "logs"
    logs.mkdir()
    env = job_env(redis_url, cache_dir, logs)
    batch_log = f"--output={logs}/batch-%j.out"

    cancelled = slurm.sbatch(env, batch_log, "--time=10", "--job-name=diffq-a")
    timed = slurm.sbatch(env, batch_log, "--time=1", "--signal=TERM@20", "--job-name=diffq-b")
    started = StartedJobRegistry("diffq", connection=conn)
    wait_for(lambda: started.count >= 2, 300, "both Slurm jobs' workers to run a job each")

    slurm.run("scancel", cancelled)  # SIGTERM to the step, SIGKILL after KillWait
    at = time.monotonic()
    state = wait_for(lambda: slurm.ended(cancelled), 120, "the cancelled job to end")
    assert state == "CANCELLED", state
    cancel_s = time.monotonic() - at
    limit_state = wait_for(lambda: slurm.ended(timed), 300, "the time limit to end the other job")
    assert limit_state in ("TIMEOUT", "COMPLETED"), limit_state  # COMPLETED: it ended before the limit

    worker_logs = "".join(p.read_text() for p in logs.glob("*.log"))
    assert worker_logs.count("SIGTERM: warm shutdown") >= 2, worker_logs[-3000:]
    assert "Traceback" not in worker_logs, worker_logs[-3000:]
    assert FailedJobRegistry("diffq", connection=conn).count == 0
    left = len(list(out.rglob("*.png")))
    assert left < images, "the campaign finished before Slurm stopped the workers: make it longer"

    # a new submission (as a requeued or preempted allocation starts again) takes the rest: a
    # job array of two single workers, each ending when the queue is empty
    rest = slurm.sbatch({**env, "DIFFQ_WORKER_ARGS": "--burst"}, batch_log, "--time=20", "--array=0-1")
    state = wait_for(lambda: slurm.ended(rest), 900, "the job array to drain the queue")
    assert state == "COMPLETED,COMPLETED", (state, worker_logs[-2000:])
    assert_exactly_once(out, images)
    assert FailedJobRegistry("diffq", connection=conn).count == 0
    print(
        f"scancel to the job's end: {cancel_s:.1f} s; the time-limited job ended {limit_state}; "
        f"images before the new job: {left} of {images}"
    )


def test_the_docs_first_try_runs_as_written_on_slurm(slurm, cache_dir, tmp_path):
    """docs/slurm.md's Redis block, then its first-try block, pasted into a shell on the login
    node: only the site's own words differ (host, port, password, the shared folder)."""
    shared, port, password = tmp_path / "shared", free_port(), "docs-test-password"
    shared.mkdir()
    page = ROOT / "docs" / "slurm.md"
    redis_block = at_site(block(page, "## Redis for a cluster"), {"6379": str(port), "/shared/": f"{shared}/"})
    first_try = at_site(
        block(page, "# Slurm clusters"),
        {"PASSWORD@login1:6379": f"{password}@127.0.0.1:{port}", "/shared/": f"{shared}/"},
    )
    env = {**slurm.env, "PASSWORD": password, "DIFFQ_CACHE": str(cache_dir)}
    for name in ("REDIS_URL", "VIRTUAL_ENV", "DIFFQ_GPUS", "DIFFQ_WORKER", "DIFFQ_WORKER_ARGS", "PYTHONPATH"):
        env.pop(name, None)  # nothing of the test's own environment stands in for a doc's line
    try:
        ran = run_block(redis_block, ROOT, env, timeout=60)
        assert ran.returncode == 0, ran.stderr
        ran = run_block(first_try, ROOT, env, timeout=900)
        assert ran.returncode == 0, f"exit {ran.returncode}\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
        run = shared / "runs" / "try"
        assert_exactly_once(run / "out", 13)
        assert [p.name for p in run.glob("diffq-*.out")], list(run.iterdir())  # the job's output, in --chdir
        logs = "".join(p.read_text() for p in (run / "logs").glob("diffq-*.log"))
        assert "serving queue" in logs and "Traceback" not in logs, logs[-3000:]
        assert not list(ROOT.glob("diffq-*.out")), "the job wrote its output into the repo"
    finally:
        cli = ["redis-cli", "-p", str(port), "--no-auth-warning", "-a", password, "shutdown", "nosave"]
        subprocess.run(cli, capture_output=True, timeout=30)
