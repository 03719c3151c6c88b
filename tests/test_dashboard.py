"""`producer dashboard`: the real rq-dashboard 0.9.0, with its Workers page working while a job
runs (rq-dashboard alone answers HTTP 500 then), basic auth required, delete buttons off."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, SLOW, free_port, kill, producer, running_job, start_worker, wait_for, write_csv

pytestmark = pytest.mark.slow  # real worker processes through faults and timeouts


def get(url: str, auth: tuple[str, str] | None = ("diffq", "s3cret"), data: bytes | None = None):
    request = urllib.request.Request(url, data=data)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def answers(url: str) -> bool:
    try:
        get(url)
    except (urllib.error.URLError, ConnectionError):
        return False
    return True


def dashboard(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str] | subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "producer", "dashboard", *args]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)


def test_workers_page_shows_the_running_job(env, conn, tmp_path):
    rows = write_csv(tmp_path / "p.csv", "prompt\nshown on the dashboard\n")
    assert producer("enqueue", rows, *SLOW, "--output", tmp_path / "out").exit_code == 0
    # the job stays at its third step while the dashboard starts and a browser renders it
    held = {**env, "HELD_STEP": str(tmp_path / "never")}
    worker = start_worker(held, tmp_path / "w.log", "--name", "diffq-gpu0-test")
    port = free_port()
    dash = dashboard({**env, "RQ_DASHBOARD_PASSWORD": "s3cret"}, "--port", str(port))
    root = f"http://127.0.0.1:{port}/0/data"
    try:
        job = wait_for(lambda: running_job(conn, "diffq-gpu0-test"), 120, "the worker to be denoising")
        wait_for(lambda: answers(f"{root}/queues.json"), 600, "the dashboard to answer")
        with pytest.raises(urllib.error.HTTPError) as denied:
            get(f"{root}/workers.json", auth=None)
        assert denied.value.code == 401
        workers = get(f"{root}/workers.json")["workers"]  # HTTP 500 with plain rq-dashboard
        (listed,) = [w for w in workers if w["name"] == "diffq-gpu0-test"]
        assert listed["state"] == "busy" and listed["current_job"]["job_id"] == job.id
        assert listed["current_job"]["description"].startswith("'shown on the dashboard' · 1 img")
        # the page shows call_string: the description and the job's progress, not run_job(spec=...)
        shown = listed["current_job"]["call_string"]
        assert shown.startswith("'shown on the dashboard' · 1 img") and "step " in shown and "run_job" not in shown
        page = get(f"{root}/job/{job.id}.json")
        assert "step " in page["description"] and page["status"] == "started"
        refused = get(f"http://127.0.0.1:{port}/job/{job.id}/delete", data=b"")
        assert refused == {"status": "DISABLED"}
        # Prometheus metrics beside the pages, behind the same basic auth (producer/metrics.py)
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert denied.value.code == 401
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"diffq:s3cret").decode())
        with urllib.request.urlopen(request, timeout=30) as response:
            scraped = response.read().decode()
        assert 'diffq_jobs{queue="diffq",state="running"} 1.0' in scraped, scraped

        # in a browser: the Workers page's script renders the running job with its progress
        page = rendered(f"http://diffq:s3cret@127.0.0.1:{port}/0/view/workers", tmp_path)
        shown = r"diffq-gpu0-test 'shown on the dashboard' · 1 img · 64x64 · .*? · step \d+/\d+ · 0/1 img"
        row = re.search(shown, page)
        assert row is not None, page[:3000]
        assert "Python RQ version: 3." in page

        # rq-dashboard on its own, with --json, fails on the same page while the job runs
        plain_port = free_port()
        plain = subprocess.Popen(
            [
                "rq-dashboard",
                "--json",
                "--bind",
                "127.0.0.1",
                "--port",
                str(plain_port),
                "--redis-url",
                env["REDIS_URL"],
            ],
            env={**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            plain_root = f"http://127.0.0.1:{plain_port}/0/data"
            wait_for(lambda: answers_plain(f"{plain_root}/queues.json"), 600, "plain rq-dashboard to answer")
            with pytest.raises(urllib.error.HTTPError) as broken:
                get(f"{plain_root}/workers.json", auth=None)
            assert broken.value.code == 500 and running_job(conn, "diffq-gpu0-test") is not None
        finally:
            kill(plain)
    finally:
        for proc in (dash, worker):
            kill(proc)


def answers_plain(url: str) -> bool:
    try:
        get(url, auth=None)
    except (urllib.error.URLError, ConnectionError):
        return False
    return True


def test_dashboard_refuses_to_start_without_a_password(env):
    done = subprocess.run(
        [sys.executable, "-m", "producer", "dashboard"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: the dashboard needs a password: --password or RQ_DASHBOARD_PASSWORD (basic auth)"
    )


def test_a_job_page_shows_progress_in_words_and_no_requeue_for_a_permanent_failure():
    from producer.dashboard import readable_job

    meta = {"step": 12, "steps": 30, "images": 8, "images_done": 3}
    page = readable_job({"description": "'a fox' · 8 img", "status": "started", "metadata": json.dumps(meta)})
    assert page["description"] == "'a fox' · 8 img — step 12/30 · 3/8 img"
    failed = {"error": "adapter '/x' not found", "permanent": True}
    page = readable_job({"description": "'a fox'", "status": "failed", "metadata": json.dumps(failed)})
    assert page["status"].startswith("failed (permanent")  # rq-dashboard shows Requeue only for "failed"
    retryable = readable_job({"status": "failed", "metadata": json.dumps({"error": "x", "permanent": False})})
    assert retryable["status"] == "failed"


def rendered(url: str, tmp_path: Path) -> str:
    """The page's DOM after its scripts ran, from headless Chromium (Debian's ``chromium``)."""
    out = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={tmp_path / 'chromium'}",
         "--virtual-time-budget=8000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    text = re.sub(r"<script.*?</script>", " ", out.stdout, flags=re.S)  # what shows, not the templates
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def test_dashboard_refuses_env_examples_placeholder_password(env):
    done = subprocess.run(
        [sys.executable, "-m", "producer", "dashboard", "--password", "change-me-dashboard"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "RQ_DASHBOARD_PASSWORD is still .env.example's placeholder" in done.stderr


def test_dashboard_stops_on_sigterm_at_once_with_exit_0(env):
    """In a container the dashboard is PID 1, which ignores SIGTERM unless it handles it: every
    `docker compose down` waited 10 s and ended it with SIGKILL (exit 137). It handles it now."""
    port = free_port()
    proc = dashboard(env, "--port", str(port), "--password", "s3cret")
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/0/data/queues.json"), 600, "the dashboard to answer")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # an unhandled SIGTERM ends it by the signal (-15), never 0
    finally:
        proc.kill()
        proc.wait()
