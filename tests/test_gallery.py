"""``producer gallery OUT`` (issue 79, part): an output's images by prompt with their parameters
and scores, filtered and ordered by a score, and its ranked pairs side by side, behind the
dashboard's basic auth; only images the metadata lists are served. Rendered by headless Chromium."""

from __future__ import annotations

import base64
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from itertools import combinations
from pathlib import Path

import pytest
from conftest import ROOT, free_port, wait_for
from test_dashboard import rendered
from test_pairs import SCORES, scored_output

PASSWORD = "s3cret-gallery"


@pytest.fixture
def gallery(env, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    records = scored_output(out)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "producer", "gallery", str(out), "--port", str(port)],
        env={**env, "RQ_DASHBOARD_PASSWORD": PASSWORD}, cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(root + "/"), 60, "the gallery to answer")
    yield root, out, records, proc
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def get(url: str, auth: bool = True) -> tuple[int, bytes]:
    headers = {"Authorization": "Basic " + base64.b64encode(f"diffq:{PASSWORD}".encode()).decode()} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as page:
            return page.status, page.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def answers(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False


def test_the_gallery_shows_each_prompts_images_scores_and_pairs_and_nothing_else(gallery, tmp_path):
    root, out, records, proc = gallery
    assert get(root + "/", auth=False)[0] == 401
    status, page = get(root + "/")
    text = page.decode()
    assert status == 200 and "3 prompt(s), 12 image(s)" in text
    assert all(f'src="/image/{r["file_name"]}"' in text for r in records)
    assert "aesthetic 7.5" in text  # each image's scores in its title
    high = get(root + "/?where=aesthetic%20%3E%205.5&by=aesthetic")[1].decode()
    assert f"{sum(v > 5.5 for v in SCORES)} image(s) where aesthetic &gt; 5.5" in high
    sources = re.findall(r'<img src="/image/([^"]+)"', high)
    first_group = [s for s in sources if s in {r["file_name"] for r in records if r["prompt"] == "synthetic prompt 0"}]
    scores = {r["file_name"]: r["scores"]["aesthetic"] for r in records}
    assert [scores[s] for s in first_group] == sorted((scores[s] for s in first_group), reverse=True)
    status, png = get(root + "/image/" + records[0]["file_name"])
    assert status == 200 and png == (out / records[0]["file_name"]).read_bytes()
    for name in ("metadata.jsonl", "../" * 6 + "etc/passwd", "images/../metadata.jsonl"):
        assert get(root + "/image/" + name)[0] == 404
    expected = sum(
        abs(a["scores"]["aesthetic"] - b["scores"]["aesthetic"]) >= 1
        for prompt in {r["prompt"] for r in records}
        for a, b in combinations([r for r in records if r["prompt"] == prompt], 2)
    )
    assert f"{expected} pair(s) by aesthetic, margin 1" in get(root + "/pairs?by=aesthetic&margin=1")[1].decode()
    assert get(root + "/?where=aesthetic")[0] == 400
    shown = rendered(root.replace("//", f"//diffq:{PASSWORD}@") + "/pairs?by=aesthetic&margin=1", tmp_path)
    assert "synthetic prompt 0" in shown and "preferred" in shown
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_the_gallery_needs_a_password_and_an_output(env, tmp_path: Path):
    for args, said in [
        ((str(tmp_path),), "needs a password"),
        ((str(tmp_path), "--password", "x"), "no metadata.jsonl"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "producer", "gallery", *args], env={**env, "RQ_DASHBOARD_PASSWORD": ""},
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
