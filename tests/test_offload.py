"""Mid-range GPUs: where the weights live (``--offload``) and how many images a batch holds,
sized from measured memory rather than from out-of-memory errors.

The choice logic runs here against real memory-profile files (the peaks a GPU worker measured
are given, as a GPU would have recorded them); the offload path runs for real on the ``tiny``
model: diffusers' model offload hooks on the CPU, adapters switched under them, and a worker
process through the queue. The GPU figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
from conftest import TINY_FLAGS, RedisServer, producer, run_worker, write_csv
from rq.job import Job
from rq.serializers import JSONSerializer

from common.errors import ConfigError, ModelLoadError
from common.jobspec import GenParams
from common.queues import get_queue
from common.settings import Settings
from worker.pipelines.generate import run_batch
from worker.pipelines.memory import Budget, GiB, Profiles, candidates, largest_batch
from worker.pipelines.offload import weights_in_place
from worker.pipelines.warm import WarmPipelines

PARAMS = GenParams(model="tiny", width=64, height=64, steps=3)


def linear(base: float, per_image: float) -> dict[int, int]:
    """Peaks as a GPU measures them: resident bytes plus a share per image."""
    return {b: int((base + per_image * b) * GiB) for b in (1, 2, 4, 8, 16)}


class Probe:
    """``measure(batch)`` for largest_batch: the peaks of ``table``, None (out of memory) past ``oom_from``."""

    def __init__(self, table: dict[int, int], oom_from: int | None = None) -> None:
        self.table, self.oom_from, self.asked = table, oom_from, []

    def __call__(self, batch: int) -> int | None:
        self.asked.append(batch)
        if self.oom_from is not None and batch >= self.oom_from:
            return None
        return self.table[batch]


def test_candidates_are_powers_of_two_then_the_limit():
    assert candidates(8) == [1, 2, 4, 8]
    assert candidates(12) == [1, 2, 4, 8, 12]
    assert candidates(3) == [1, 2, 3]
    assert candidates(1) == [1]


@pytest.mark.parametrize(
    ("usable_gib", "batch", "asked"),
    [
        (80, 8, [1, 2, 8]),  # all of a chunk of 8 fits: predicted from 1 and 2, then measured
        (17, 4, [1, 2, 4]),  # 6.6 + 2.0 * 8 = 22.6 GiB is predicted from 2 and 4, not tried
        (12, 2, [1, 2]),  # batch 4 (14.6) predicted past 0.9 * 12
        (11, 1, [1, 2]),  # batch 2 measured at 10.6: past 0.9 * 11
        (9, 1, [1]),  # not even one image: batch 1 (the job says out of memory)
    ],
)
def test_the_largest_batch_that_fits_is_measured_not_guessed_from_an_oom(usable_gib, batch, asked):
    probe = Probe(linear(6.6, 2.0))
    remembered: dict[int, int] = {}
    got, peak = largest_batch(probe, {}, 8, Budget(usable_gib * GiB, "gpu"), remember=remembered.__setitem__)
    assert got == batch
    assert peak == probe.table[batch]
    assert probe.asked == asked
    assert remembered == {b: probe.table[b] for b in asked}  # kept for the next worker


def test_a_limit_the_line_promised_but_that_does_not_fit_sends_the_search_back_between():
    """A convex peak: batch 8 predicted from 1 and 2 at 21 GiB (fits 0.9 * 30), measured at 30."""
    probe = Probe({1: 7 * GiB, 2: 9 * GiB, 4: 13 * GiB, 8: 30 * GiB})
    remembered: dict[int, int] = {}
    got, peak = largest_batch(probe, {}, 8, Budget(30 * GiB, "gpu"), remember=remembered.__setitem__)
    assert (got, peak) == (4, 13 * GiB)
    assert probe.asked == [1, 2, 8, 4]
    assert remembered == {1: 7 * GiB, 2: 9 * GiB, 4: 13 * GiB, 8: 30 * GiB}  # the refusal is kept too


def test_known_peaks_measure_nothing_and_an_oom_in_a_probe_stops_the_search():
    table = linear(6.6, 2.0)
    nothing = Probe(table)
    assert largest_batch(nothing, table, 8, Budget(80 * GiB, "gpu"), remember=lambda b, p: None)[0] == 8
    assert nothing.asked == []
    # a fleet's profile of another worker's search (1, 2 and the limit): nothing between is probed
    sparse = Probe(table)
    known = {b: table[b] for b in (1, 2, 8)}
    assert largest_batch(sparse, known, 8, Budget(80 * GiB, "gpu"), remember=lambda b, p: None) == (8, table[8])
    assert sparse.asked == []
    # a probe that runs out of memory (a convex peak the line did not predict) keeps the last that ran
    oom = Probe(table, oom_from=4)
    assert largest_batch(oom, {}, 8, Budget(80 * GiB, "gpu"), remember=lambda b, p: None)[0] == 2
    # nothing fits: batch 1, which fails the job with a clear out-of-memory message
    assert largest_batch(Probe(table), {}, 8, Budget(4 * GiB, "gpu"), remember=lambda b, p: None)[0] == 1


def test_profiles_persist_merge_between_workers_and_survive_a_bad_file(tmp_path, caplog):
    path = tmp_path / "memory-profiles.json"
    one, two = Profiles(path), Profiles(path)
    one.record("a", 2, 100)
    two.record("b", 4, 200)  # a second worker of the host: re-reads before writing
    assert Profiles(path).peaks("a") == {2: 100}
    assert Profiles(path).peaks("b") == {4: 200}
    assert not list(tmp_path.glob(".*.tmp"))
    path.write_text("{not json")
    assert Profiles(path).peaks("a") == {}
    assert "unreadable" in caplog.text
    (tmp_path / "a-file").write_text("")
    Profiles(tmp_path / "a-file" / "p.json").record("a", 1, 1)  # no raise: measured again next start
    assert "not saved" in caplog.text


@pytest.fixture
def auto_cache(cache_dir, tmp_path) -> WarmPipelines:
    cache = WarmPipelines(str(tmp_path / "cache"), device="cpu", offload="none")
    cache.offload = "auto"
    return cache


def give_peaks(cache: WarmPipelines, model: str, offload: str, levers: str, peaks: dict[int, int]) -> None:
    """Peaks as a GPU worker records them for ``model`` at its own size (tiny: 64²)."""
    assert cache.budget is not None
    params = GenParams(model=model, width=64, height=64, guidance=5.0)
    key = cache._profile_key(params, offload, type(cache.speedups)(frozenset(levers.split(",")) - {""}))
    for batch, peak in peaks.items():
        cache.profiles.record(key, batch, peak)


@pytest.mark.parametrize(
    ("usable_gib", "chosen"),
    [(80, "none"), (12, "none"), (10, "model"), (8, "model"), (5, "sequential")],
)
def test_auto_offload_takes_the_lightest_placement_that_fits(auto_cache, cache_dir, usable_gib, chosen, caplog):
    """SDXL's figures on an H100 (docs/benchmarks.md): resident with a batch of 2 peaks at
    10.6 GiB; under model offload one image peaks at 5.8 GiB."""
    auto_cache.budget = Budget(usable_gib * GiB, "NVIDIA Test GPU")
    give_peaks(auto_cache, "tiny", "none", "", {2: int(10.6 * GiB)})
    give_peaks(auto_cache, "tiny", "model", "", {1: int(5.8 * GiB)})
    from diffusers import DiffusionPipeline

    from worker.pipelines.models import ensure_tiny

    pipe = DiffusionPipeline.from_pretrained(ensure_tiny(str(cache_dir)))
    caplog.set_level("INFO", logger="diffq.worker")
    assert auto_cache._choose_offload(pipe, "tiny", None) == chosen
    assert f"offload auto: {chosen}, for {usable_gib:.1f} GiB of NVIDIA Test GPU" in caplog.text


def test_the_batch_comes_from_the_profile_and_the_job_result_says_which(auto_cache):
    loaded, _ = auto_cache.get("tiny")  # on the CPU: auto is none
    assert loaded.offload == "none"
    auto_cache.budget = Budget(12 * GiB, "NVIDIA Test GPU")
    key = auto_cache._profile_key(PARAMS, "none", loaded.speedups)
    for batch, peak in linear(6.6, 2.0).items():
        auto_cache.profiles.record(key, batch, peak)
    assert auto_cache.batch_for(loaded, PARAMS, 8, None) == 2
    assert auto_cache.batch_for(loaded, PARAMS, 1, None) == 1
    auto_cache.budget = None  # the CPU again: one call for the whole chunk
    from worker.pipelines.backend import Batch

    result, fitted = auto_cache.generate(loaded, Batch(PARAMS, ["a"] * 3, [""] * 3, [1, 2, 3], max_batch=8))
    assert (result.batch, result.offload, fitted) == (3, "none", 8)  # 3 ran; up to 8 may


def test_sequential_offload_needs_a_gpu_and_settings_refuse_a_typo(cache_dir, monkeypatch):
    with pytest.raises(ConfigError, match="--offload sequential streams weights to a GPU"):
        WarmPipelines(str(cache_dir), device="cpu", offload="sequential")
    monkeypatch.setenv("DIFFQ_OFFLOAD", "cpu")
    with pytest.raises(ConfigError, match="--offload 'cpu': use one of auto, none, model, sequential"):
        Settings.load()
    monkeypatch.setenv("DIFFQ_OFFLOAD", "model")
    monkeypatch.setenv("DIFFQ_GPU_MEMORY", "eight")
    with pytest.raises(ConfigError, match="DIFFQ_GPU_MEMORY='eight': gpu_memory must be a number"):
        Settings.load()
    monkeypatch.setenv("DIFFQ_GPU_MEMORY", "8")
    assert (Settings.load().offload, Settings.load().gpu_memory) == ("model", 8.0)


class FakePipe:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def remove_all_hooks(self) -> None:
        self.calls.append("remove")

    def enable_model_cpu_offload(self, device: Any) -> None:
        self.calls.append(f"model:{device}")

    def enable_sequential_cpu_offload(self, device: Any) -> None:
        self.calls.append(f"sequential:{device}")


@pytest.mark.parametrize("mode", ["model", "sequential"])
def test_offload_hooks_come_off_for_an_adapter_change_and_go_back_even_when_it_fails(mode):
    pipe = FakePipe()
    with pytest.raises(RuntimeError), weights_in_place(pipe, mode, torch.device("cpu")):
        pipe.calls.append("merge")
        raise RuntimeError("adapter")
    assert pipe.calls == ["remove", "merge", "remove", f"{mode}:cpu"]
    resident = FakePipe()
    with weights_in_place(resident, "none", torch.device("cpu")):
        resident.calls.append("merge")
    assert resident.calls == ["merge"]


def render(cache: WarmPipelines, adapter: str | None) -> np.ndarray:
    loaded, _ = cache.get("tiny")
    cache.use_adapter(loaded, adapter, 1.0)
    return np.asarray(run_batch(loaded.pipe, PARAMS, ["a red fox"], [""], [7]).images[0], dtype=np.float32)


def test_model_offload_runs_the_hooks_and_switches_adapters_like_the_resident_pipeline(cache_dir):
    resident = WarmPipelines(str(cache_dir), device="cpu", offload="none")
    offloaded = WarmPipelines(str(cache_dir), device="cpu", offload="model")
    loaded, _ = offloaded.get("tiny")
    assert loaded.offload == "model"
    assert hasattr(loaded.pipe.unet, "_hf_hook")  # accelerate's hook moves it in for its turn
    for adapter in (None, "tiny-dora", None, "tiny-dora"):
        assert np.array_equal(render(offloaded, adapter), render(resident, adapter)), adapter
    assert np.abs(render(offloaded, "tiny-dora") - render(offloaded, None)).mean() > 1.0


@pytest.mark.worker
@pytest.mark.long
def test_a_worker_with_model_offload_drains_a_campaign_and_records_its_batch(
    redis_server: RedisServer, cache_dir: Path, tmp_path: Path
):
    out = tmp_path / "out"
    queue = "offload"
    env = {**os.environ, "REDIS_URL": redis_server.url, "DIFFQ_CACHE": str(cache_dir), "DIFFQ_QUEUE": queue}
    prompts = write_csv(tmp_path / "p.csv", "prompt,adapter\na fox,\na fox,tiny-dora\na cat,\na cat,tiny-dora\n")
    old = os.environ.copy()
    os.environ.update(env)
    try:
        assert producer("enqueue", prompts, *TINY_FLAGS, "--output", out, "--chunk-size", "2").exit_code == 0
    finally:
        os.environ.clear()
        os.environ.update(old)
    worker = run_worker(env, "--offload", "model")
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "offload model)" in worker.stderr
    conn = redis.Redis.from_url(redis_server.url)
    q = get_queue(queue, conn)
    ids = q.finished_job_registry.get_job_ids()
    assert len(ids) == 2 and not q.failed_job_registry.get_job_ids()
    for job_id in ids:
        result = Job.fetch(job_id, connection=conn, serializer=JSONSerializer).return_value()
        assert (result["offload"], result["batch"]) == ("model", 2)
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and len(list((out / "images").rglob("*.png"))) == 4


def test_a_model_that_does_not_fit_is_the_workers_problem_not_the_jobs(cache_dir, monkeypatch):
    """An out-of-memory error while loading gives the job back (ModelLoadError) with what to do;
    before, it failed the job, and each retry on the same worker ran out again."""
    cache = WarmPipelines(str(cache_dir), device="cpu")

    def too_big(model: str) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 26.00 MiB")

    monkeypatch.setattr(cache, "_load", too_big)
    with pytest.raises(ModelLoadError, match=r"does not fit in this worker's GPU memory .*--offload model"):
        cache.get("sdxl-random")


def test_sdxl_random_is_drawn_in_its_dtype_where_an_fp32_draw_does_not_fit(cache_dir, monkeypatch):
    """Drawn in fp32 and cast, SDXL took 12.6 GiB to build a 6.5 GiB fp16 pipeline: past a 12 GiB
    worker. The fp32 draw stays the default (fp16 and bf16 runs compare the same model)."""
    from worker.pipelines import models

    calls: list[bool] = []

    def build(device: Any, dtype: Any, *, drawn_in_dtype: bool = False) -> str:
        calls.append(drawn_in_dtype)
        if not drawn_in_dtype:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 50.00 MiB")
        return "pipeline"

    monkeypatch.setattr(models, "sdxl_random", build)
    assert WarmPipelines(str(cache_dir), device="cpu")._load("sdxl-random") == "pipeline"
    assert calls == [False, True]


def test_a_new_host_takes_the_fleets_profiles_from_redis_and_a_silent_redis_costs_only_a_probe(
    tmp_path, redis_url, conn, caplog
):
    """``--compile-cache redis``: peaks one host measured are another host's (no probe there),
    kept in its own file too; a Redis that does not answer is said once and measured around."""
    first = Profiles(tmp_path / "host-a" / "memory-profiles.json", redis_url)
    first.record("H200|sdxl", 16, 3 * GiB)
    assert conn.hgetall("diffq:memory-profile:H200|sdxl") == {b"16": str(3 * GiB).encode()}
    second = Profiles(tmp_path / "host-b" / "memory-profiles.json", redis_url)
    assert second.peaks("H200|sdxl") == {16: 3 * GiB}
    conn.flushall()
    assert Profiles(tmp_path / "host-b" / "memory-profiles.json").peaks("H200|sdxl") == {16: 3 * GiB}
    assert Profiles(tmp_path / "host-c" / "p.json", redis_url).peaks("H200|sdxl") == {}  # nobody measured it
    silent = Profiles(tmp_path / "host-d" / "p.json", "redis://127.0.0.1:1/0")
    assert silent.peaks("k") == {}
    silent.record("k", 1, 5)
    assert silent.peaks("k") == {1: 5}
    said = [r.getMessage() for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("memory profiles: the shared Redis"), said
