"""Metrics for a fleet: a real Prometheus (Debian's ``prometheus``) scrapes ``producer metrics``
and a worker's ``--metrics-port`` during a run, and its answers match the ledger."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
from conftest import ROOT, TINY_FLAGS, free_port, kill, producer, start_worker, wait_for
from prometheus_client import generate_latest

from common.queues import images_key
from producer.metrics import registry_for


def test_queue_metrics_are_what_producer_status_says(env, conn, tmp_path):
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\n" + "".join(f"m {i}\n" for i in range(6)), encoding="utf-8")
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", tmp_path / "out").exit_code == 0
    text = generate_latest(registry_for(conn, ttl=30)).decode()
    assert 'diffq_jobs{queue="diffq",state="queued"} 3.0' in text
    assert 'diffq_images_enqueued{queue="diffq"} 6.0' in text and 'diffq_complete{queue="diffq"} 0.0' in text
    status = json.loads(producer("status", "--json").output)
    assert status["jobs"]["queued"] == 3 and status["images"]["enqueued"] == 6


def test_scores_are_series_with_the_mean_and_spread_producer_status_gives(env, conn, tmp_path):
    """The sums a worker keeps for each scorer (as worker/serving/task.py writes them) become
    ``diffq_images_scored``, ``diffq_score_mean`` and ``diffq_score_sd`` by queue and score."""
    from common.queues import scores_key

    rows = tmp_path / "p.csv"
    rows.write_text("prompt\na b\n", encoding="utf-8")
    assert producer("enqueue", rows, *TINY_FLAGS, "--output", tmp_path / "out").exit_code == 0
    for value in (1.0, 2.0, 6.0):
        for part, amount in (("n", 1), ("sum", value), ("sumsq", value * value)):
            conn.hincrbyfloat(scores_key("diffq"), f"clip:{part}", amount)
    text = generate_latest(registry_for(conn, ttl=30)).decode()
    said = json.loads(producer("status", "--json").output)["scores"]["clip"]
    assert said["n"] == 3 and abs(said["mean"] - 3.0) < 1e-9
    assert 'diffq_images_scored{queue="diffq",score="clip"} 3.0' in text
    assert 'diffq_score_mean{queue="diffq",score="clip"} 3.0' in text
    assert f'diffq_score_sd{{queue="diffq",score="clip"}} {float(said["sd"])!r}' in text, text


def _query(port: int, expr: str) -> float | None:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            result = json.load(answer)["data"]["result"]
    except OSError:
        return None
    return float(result[0]["value"][1]) if result else None


@pytest.mark.worker
@pytest.mark.long
def test_a_real_prometheus_scrapes_the_queue_and_the_worker_and_agrees_with_the_ledger(env, conn, tmp_path):
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: make install (Debian's prometheus package)"
    queue_port, worker_port, prom_port = free_port(), free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n"
        f"  - job_name: queue\n    static_configs: [{{targets: ['127.0.0.1:{queue_port}']}}]\n"
        f"  - job_name: worker\n    static_configs: [{{targets: ['127.0.0.1:{worker_port}']}}]\n"
    )
    rows = tmp_path / "p.csv"
    rows.write_text("prompt\n" + "".join(f"scraped {i}\n" for i in range(8)), encoding="utf-8")
    assert producer("enqueue", rows, *TINY_FLAGS, "--chunk-size", "2", "--output", tmp_path / "out").exit_code == 0
    serve = [sys.executable, "-c", "from producer.cli import main; main()", "metrics", "--port", str(queue_port)]
    procs = [
        subprocess.Popen(serve, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    worker = start_worker(env, tmp_path / "w.log", "--name", "SCRAPED", "--metrics-port", str(worker_port))
    try:
        wait_for(lambda: int(conn.get(images_key("diffq")) or 0) == 8, 300, "the campaign written")
        ledger = int(conn.get(images_key("diffq")))
        checks = {
            'diffq_images_written{queue="diffq"}': ledger,
            'diffq_jobs{queue="diffq",state="finished"}': 4,
            'diffq_complete{queue="diffq"}': 1,
            'sum(diffq_worker_images_written_total{worker="SCRAPED"})': ledger,
            'sum(diffq_worker_jobs_total{outcome="finished"})': 4,
            "sum(diffq_worker_job_seconds_count)": 4,
        }
        for expr, want in checks.items():
            wait_for(lambda e=expr, w=want: _query(prom_port, e) == w, 120, f"Prometheus: {expr} == {want}")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(120) == 0
    finally:
        kill(worker)
        for proc in procs:
            proc.terminate()
            proc.wait(30)
