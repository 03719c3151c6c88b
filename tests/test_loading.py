"""A model download shows its progress. No download can run here, so this drives the bar that
``huggingface_hub.snapshot_download`` creates (from its module's ``hf_tqdm``) while a load is
under way, and checks that the worker's load reports what it does and clears it after."""

from __future__ import annotations

import huggingface_hub._snapshot_download as snapshot

from worker.pipelines.loading import download_progress
from worker.pipelines.warm import WarmPipelines


def test_download_bytes_are_reported_every_ten_percent():
    said: list[str] = []
    with download_progress(said.append):
        bar = snapshot.hf_tqdm(total=0, unit="B", desc="Downloading bytes")  # as snapshot_download makes it
        bar.total = 7 * 2**30
        for _ in range(10):
            bar.update(int(0.37 * 2**30))
    assert said[0] == "downloading model: 378.9 MiB of 7.0 GiB (5%)"
    assert said[-1] == "downloading model: 3.7 GiB of 7.0 GiB (52%)"
    assert len(said) == 6  # 5, 10, 21, 31, 42, 52 %: one line per 10 %, not one per chunk
    assert snapshot.hf_tqdm.__name__ == "tqdm"  # put back after the load


def test_a_load_reports_what_it_does_then_clears_it(cache_dir):
    seen: list[str | None] = []
    WarmPipelines(str(cache_dir), device="cpu").get("tiny", on_progress=seen.append)
    assert seen == ["loading model tiny", None]
