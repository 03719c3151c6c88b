"""The preference issue's campaign end to end on the CPU (issue 79's "done means"): two models x
four images per prompt, two scorers, through a real burst worker; every image once with both
scores in its line, ``producer export --pairs`` giving every ranked pair (loaded by ``datasets``),
and the campaign's gallery rendered by headless Chromium: the counts shown, a filter narrows it,
a screenshot taken (``examples/gallery_screenshot.sh`` writes docs/gallery.png the same way)."""

from __future__ import annotations

import html
import json
import signal
import subprocess
import sys
from itertools import combinations

import datasets
import pytest
from conftest import ROOT, assert_exactly_once, drain, free_port, producer, wait_for, write_csv
from test_dashboard import rendered
from test_gallery import PASSWORD, answers

PROMPTS = ("a red fox in snow", "a lighthouse at dusk", "a bowl of ramen")
FLAGS = ("--width", "64", "--height", "64", "--steps", "2", "--num-images", "4")
SCORES = ("--score", "clip=tiny-clip,aesthetic=tiny-clip")


@pytest.mark.worker
@pytest.mark.long  # the whole path in one campaign; make test has each part's own test
def test_two_models_four_images_two_scorers_pairs_and_a_gallery(env, conn, tmp_path):
    out = tmp_path / "out"
    rows = write_csv(tmp_path / "p.csv", "prompt\n" + "".join(f"{p}\n" for p in PROMPTS))
    models = ("--model", "tiny", "--model", "tiny-pixart")
    assert producer("enqueue", rows, *models, *FLAGS, *SCORES, "--output", out).exit_code == 0
    drain(env, tmp_path / "w.log")
    assert_exactly_once(out, 24)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert sorted({line["model"] for line in lines}) == ["tiny", "tiny-pixart"]
    assert all(set(line["scores"]) == {"clip", "aesthetic"} for line in lines)
    again = producer("enqueue", rows, *models, *FLAGS, *SCORES, "--output", out)
    assert again.exit_code == 0 and again.output.count("0 new") == 2, again.output

    expected = sum(
        a["scores"]["aesthetic"] != b["scores"]["aesthetic"]
        for prompt in PROMPTS
        for a, b in combinations([r for r in lines if r["prompt"] == prompt], 2)
    )  # every two of a prompt's 8 images (both models'), ties dropped
    assert expected > 3 * 20
    done = producer("export", out, "--to", tmp_path / "pairs", "--format", "parquet", "--by", "aesthetic", "--pairs")
    assert done.exit_code == 0 and f"as {expected} sample(s)" in done.output, done.output
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "pairs" / "*.parquet"), split="train")
    assert len(ds) == expected
    assert all(row["label_0"] == float(row["score_0"] > row["score_1"]) for row in ds)
    assert {row["model_0"] for row in ds} | {row["model_1"] for row in ds} == {"tiny", "tiny-pixart"}

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "producer", "gallery", str(out), "--port", str(port)],
        env={**env, "RQ_DASHBOARD_PASSWORD": PASSWORD}, cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        root = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(root + "/"), 60, "the gallery to answer")
        authed = root.replace("//", f"//diffq:{PASSWORD}@")
        page = rendered(authed + "/", tmp_path)
        assert "3 prompt(s), 24 image(s)" in page, page[:500]
        median = sorted(r["scores"]["aesthetic"] for r in lines)[12]
        narrowed = html.unescape(rendered(authed + f"/?where=aesthetic%20%3E%20{median}", tmp_path))
        kept = sum(r["scores"]["aesthetic"] > median for r in lines)
        assert 0 < kept < 24 and f" prompt(s), {kept} image(s) where aesthetic > " in narrowed, narrowed[:300]
        one = html.unescape(rendered(authed + "/?model=tiny-pixart&by=clip", tmp_path))
        assert "3 prompt(s), 12 image(s) where model = tiny-pixart" in one and " tiny · seed" not in one
        shot = tmp_path / "gallery.png"
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'chromium'}", "--window-size=1200,900", "--virtual-time-budget=8000",
             f"--screenshot={shot}", authed + "/"],
            capture_output=True, timeout=120, check=True,
        )  # fmt: skip
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
