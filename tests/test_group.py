"""xDiT worker groups on the CPU: real torchrun, real gloo process groups, the tiny model, a
real redis-server. xDiT itself needs CUDA, so these runs split work the ways that are ours
(data parallel, SDXL CFG parallel); the protocol around them is the same on GPUs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from conftest import ROOT, TINY_FLAGS, RedisServer, images_under, kill, producer, run_worker, wait_for
from held_group import FINALIZED
from PIL import Image
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from common.errors import ConfigError
from worker.group.config import GroupLayout, dp_slice

#: about 4 s a job on 2 CPU cores, so a kill or a signal lands mid-denoising
SLOW = ("--model", "tiny", "--width", "64", "--height", "64", "--steps", "60")
TIMEOUT_S = 10


def torchrun(*args: str, ranks: int = 2, restarts: int = 0) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
        "--max-restarts", str(restarts), str(ROOT / "tests" / "held_group.py"), "--model", "tiny", "--device", "cpu",
        "--timeout", str(TIMEOUT_S), *args,
    ]  # fmt: skip


def run_group(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun(*args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def start_group(env: dict[str, str], log: Path, *args: str, restarts: int = 0) -> subprocess.Popen[bytes]:
    handle = open(log, "ab")  # noqa: SIM115 - the process owns it until it exits
    return subprocess.Popen(
        torchrun(*args, restarts=restarts), env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT
    )


def enqueue(tmp_path: Path, prompts: list[str], flags: tuple[str, ...], *extra: str) -> Path:
    path = tmp_path / "prompts.csv"
    path.write_text("prompt\n" + "".join(f"{p}\n" for p in prompts))
    output = tmp_path / "out"
    result = producer("enqueue", path, *flags, "--output", output, *extra)
    assert result.exit_code == 0, result.output
    return output


def assert_exactly_once(output: Path, expected: int) -> None:
    images = images_under(output)
    assert len(images) == expected
    for path in images:
        with Image.open(path) as image:
            image.load()
            assert image.text["prompt"]  # the same PNG text chunks as single-GPU workers
    lines = (output / "metadata.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["file_name"] for line in lines) == sorted(str(p.relative_to(output)) for p in images)


# -- the layout (pure logic) ------------------------------------------------------------------


def test_layout_arithmetic_names_every_degree() -> None:
    layout = GroupLayout.load(ulysses_degree=2, ring_degree=2, cfg_parallel=True)
    assert layout.size == 8
    with pytest.raises(ConfigError) as err:
        layout.check_world(4)
    assert "ulysses 2 × ring 2 × pipefusion 1 × data-parallel 1 × cfg-parallel 2 = 8, not 4" in str(err.value)
    GroupLayout.load(data_parallel_degree=4).check_world(4)
    assert GroupLayout.load(ulysses_degree=None, cfg_parallel=False).size == 1  # a flag not given keeps its default
    with pytest.raises(ConfigError, match="--ring-degree must be at least 1, not 0"):
        GroupLayout.load(ring_degree=0)


def test_dp_slices_cover_the_batch_once() -> None:
    for batch in range(0, 10):
        for degree in (1, 2, 3, 4):
            covered = [i for d in range(degree) for i in dp_slice(batch, degree, d)]
            assert covered == list(range(batch))


# -- real groups ------------------------------------------------------------------------------


@pytest.mark.slow
def test_bad_degrees_every_rank_exits_with_the_arithmetic(env: dict[str, str], conn: redis.Redis) -> None:
    result = run_group(env, "--ulysses-degree", "4", timeout=60)
    assert result.returncode != 0
    line = (
        "error: the degrees use 4 rank(s) but torchrun started 2: "
        "ulysses 4 × ring 1 × pipefusion 1 × data-parallel 1 = 4, not 2"
    )
    assert result.stderr.count(line) == 1, result.stderr[-3000:]
    assert "exitcode  : 2" in result.stderr  # both ranks, before loading anything
    assert "loading model" not in result.stderr
    assert conn.dbsize() == 0


@pytest.mark.slow
@pytest.mark.long
def test_parallel_vae_on_an_sdxl_group_is_one_line_from_rank_0(env: dict[str, str], conn: redis.Redis) -> None:
    """xDiT's DistVAE splits a DiT's decoder; an SDXL CFG pair decodes its own halves already."""
    result = run_group(env, "--cfg-parallel", "--parallel-vae", timeout=120)
    assert result.returncode != 0 and "exitcode  : 2" in result.stderr, result.stderr[-3000:]
    line = "error: --parallel-vae splits a DiT's decoder under xDiT"
    assert result.stderr.count(line) == 1, result.stderr[-3000:]
    assert "an SDXL CFG pair already splits its decode: half of the images on each rank" in result.stderr


@pytest.mark.slow
def test_two_rank_group_drains_the_queue(env: dict[str, str], conn: redis.Redis, tmp_path: Path) -> None:
    prompts = [f"group prompt {i}" for i in range(7)]
    output = enqueue(tmp_path, prompts, TINY_FLAGS, "--chunk-size", "3")
    result = run_group(env, "--data-parallel-degree", "2", "--burst")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(output, 7)
    finished = FinishedJobRegistry("diffq", connection=conn).get_job_ids()
    assert len(finished) == 3
    workers = {Job.fetch(i, connection=conn, serializer=JSONSerializer).worker_name for i in finished}
    assert len(workers) == 1 and workers.pop().startswith("diffq-group-cpux2-")  # one worker in rq-dashboard
    assert "rank 1: stop from rank 0 (exit 0)" in result.stderr
    assert FINALIZED not in result.stderr, result.stderr[-3000:]  # every rank left by worker/group/cli.py's _finish
    # a re-run of the same file adds nothing
    again = producer("enqueue", tmp_path / "prompts.csv", *TINY_FLAGS, "--output", output)
    assert "0 new" in again.output


@pytest.mark.slow
@pytest.mark.long
def test_cfg_parallel_image_equals_the_single_worker_image(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path
) -> None:
    """With ``empty-negative`` on both sides: the pair's unconditional rank skips every
    cross-attention, the conditional rank computes all of its rows (worker/group/engine.py). An
    odd batch's last image (here each job's one) is decoded split by rows over the pair."""
    env = {**env, "DIFFQ_SPEEDUPS": "empty-negative"}
    prompts = ["a lighthouse at dusk", "two cats", "Straße im Regen"]
    group_out = enqueue(tmp_path, prompts, TINY_FLAGS)
    result = run_group(env, "--cfg-parallel", "--burst")
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        said = rf"rank {rank}: SDXL model tiny split: CFG parallel, [^;\n]*, an odd batch's last image decoded split"
        assert re.search(said, result.stderr), result.stderr[-3000:]
    # the same rows for a single-process worker, on a queue of its own
    single_out = tmp_path / "single"
    flags = (*TINY_FLAGS, "--output", single_out, "--queue", "single")
    assert producer("enqueue", tmp_path / "prompts.csv", *flags).exit_code == 0
    assert run_worker(env, "--queue", "single").returncode == 0
    group_images = images_under(group_out)
    assert len(group_images) == 3
    worst = 0
    for path in group_images:
        other = single_out / path.relative_to(group_out)
        a = np.asarray(Image.open(path), dtype=int)
        b = np.asarray(Image.open(other), dtype=int)
        worst = max(worst, int(np.abs(a - b).max()))
    assert worst <= 2, f"max pixel difference {worst}/255"


def tiny_flux(folder: Path, heads: int = 8) -> Path:
    """A FLUX small enough for the CPU, saved as a diffusers folder; its VAE has 3 levels, so a
    token is 8x8 pixels and 72x72 makes 81 tokens (which do not split over 2 ranks)."""
    from test_context_parallel import EIGHT_HEADS

    from worker.pipelines.models import build_flux

    vae = {**EIGHT_HEADS["vae"], "block_out_channels": (4, 4, 4)}
    vae |= {"down_block_types": ("DownEncoderBlock2D",) * 3, "up_block_types": ("UpDecoderBlock2D",) * 3}
    transformer = {**EIGHT_HEADS["transformer"], "num_attention_heads": heads}
    arch = {**EIGHT_HEADS, "vae": vae, "transformer": transformer}
    build_flux(**arch, t5_vocab=None, clip_vocab=None).save_pretrained(folder)
    return folder


@pytest.mark.slow
@pytest.mark.long
def test_flux_ulysses_group_makes_the_single_worker_image_and_refuses_a_size_that_does_not_split(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path
) -> None:
    """A FLUX group with Ulysses over both ranks (diffusers' own split, worker/group/token_split.py;
    no xDiT): through the queue, its images are the single worker's; a job whose image tokens do
    not split over the ranks fails at once, for good, with the sizes that do. The group also
    tables its modulation vectors (``modulation-once``, FLUX's own, as the single worker does)."""
    model = tiny_flux(tmp_path / "tiny-flux")
    flags = ("--model", str(model), "--width", "64", "--height", "64", "--steps", "2", "--guidance", "3.5")
    prompts = tmp_path / "prompts.csv"
    prompts.write_text("prompt,width,height\na red fox,,\nStraße im Regen,,\nan odd size,72,72\n")
    group_out = tmp_path / "out"
    assert producer("enqueue", prompts, *flags, "--output", group_out).exit_code == 0
    result = run_group(env, "--model", str(model), "--ulysses-degree", "2", "--burst")
    assert result.returncode == 0, result.stderr[-3000:]
    # the split's all-to-alls are functional collectives, whose tensors gloo's threads let go of on
    # their own time: a rank that ended through the interpreter's finalization could abort (SIGABRT)
    # after a clean stop, so no rank does (worker/group/cli.py's _finish)
    assert FINALIZED not in result.stderr, result.stderr[-3000:]
    assert result.stderr.count("speedups: modulation-once (an image's modulation vectors") == 2, result.stderr[-3000:]
    for rank in (0, 1):  # each rank says how the image is split (tests/test_context_parallel.py: half the tokens;
        # tests/test_split_decode.py: half the decoder's rows)
        said = f"rank {rank}: FLUX model {model} split: Ulysses 2 (diffusers), the decoder split by rows"
        assert said in result.stderr, result.stderr[-3000:]
    failed = FailedJobRegistry("diffq", connection=conn).get_job_ids()
    assert len(failed) == 1
    job = Job.fetch(failed[0], connection=conn, serializer=JSONSerializer)
    assert job.meta["permanent"], job.meta  # not retried: no group of 2 ranks can make it
    told = "72x72 makes 81 image tokens (9x9), which do not split over this group's 2 Ulysses ranks"
    assert told in job.meta["error"], job.meta
    single_out = tmp_path / "single"
    single = producer("enqueue", prompts, *flags, "--output", single_out, "--queue", "single")
    assert single.exit_code == 0, single.output
    assert run_worker(env, "--queue", "single").returncode == 0
    group_images = images_under(group_out)
    assert len(group_images) == 2
    for path in group_images:
        a = np.asarray(Image.open(path), dtype=int)
        b = np.asarray(Image.open(single_out / path.relative_to(group_out)), dtype=int)
        assert np.abs(a - b).max() <= 1, path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "heads", "told"),
    [
        ("--ulysses-degree", 3, "{model} has 3 attention heads, which do not split over 2 ranks"),
        ("--ring-degree", 8, "the ring merges its attention with cuDNN's, which needs CUDA GPUs (compute capability "
         "8.0 or later); on this cpu machine use --ulysses-degree 2"),
    ],
)  # fmt: skip
@pytest.mark.long
def test_a_flux_split_this_group_cannot_run_is_one_line_from_rank_0(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path, flag: str, heads: int, told: str
) -> None:
    model = tiny_flux(tmp_path / "tiny-flux", heads=heads)
    result = run_group(env, "--model", str(model), flag, "2", "--burst", timeout=120)
    assert result.returncode != 0 and "exitcode  : 2" in result.stderr, result.stderr[-3000:]
    line = f"error: {flag} 2: " + told.format(model=model)
    assert result.stderr.count(line) == 1, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.long
def test_error_on_rank_1_fails_that_job_and_the_group_goes_on(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path
) -> None:
    prompts = ["fine one", "this one will boom", "fine two"]
    output = enqueue(tmp_path, prompts, TINY_FLAGS, "--chunk-size", "1", "--max-retries", "0")
    result = subprocess.run(
        torchrun("--data-parallel-degree", "2", "--burst"),
        env={**env, "DIFFQ_FAULT_GROUP_RANK": "1:boom"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_exactly_once(output, 2)
    failed = FailedJobRegistry("diffq", connection=conn).get_job_ids()
    assert len(failed) == 1
    job = Job.fetch(failed[0], connection=conn, serializer=JSONSerializer)
    assert "boom" in job.kwargs["spec"]["items"][0]["prompt"]
    assert job.meta["error"].startswith("rank 1: InjectedFault: injected fault on rank 1")
    assert len(FinishedJobRegistry("diffq", connection=conn).get_job_ids()) == 2
    status = producer("status")
    assert "rank 1: InjectedFault" in status.output


def _pid_of_rank(log: Path, rank: int) -> int | None:
    match = re.search(rf"rank {rank} \(pid (\d+)\): loading model", log.read_text(errors="replace"))
    return int(match.group(1)) if match else None


def _running(conn: redis.Redis, min_step: int = 3) -> Job | None:
    for job_id in StartedJobRegistry("diffq", connection=conn).get_job_ids(cleanup=False):
        job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
        if (job.meta.get("step") or 0) >= min_step:
            return job
    return None


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_killing_rank_1_ends_the_group_and_the_job_completes_after_restart(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path
) -> None:
    output = enqueue(tmp_path, [f"kill test {i}" for i in range(4)], SLOW, "--chunk-size", "2")
    log = tmp_path / "group.log"
    group = start_group(env, log, "--data-parallel-degree", "2", "--burst", restarts=1)
    try:
        rank1 = wait_for(lambda: _pid_of_rank(log, 1), 600, "rank 1 to start")
        job = wait_for(lambda: _running(conn), 120, "a job to be denoising")
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: "lost a rank" in log.read_text(errors="replace") or "left the group" in log.read_text(),
                 TIMEOUT_S + 20, "rank 0 to notice")  # fmt: skip
        noticed = time.monotonic() - killed
        assert group.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        kill(group)
    text = log.read_text()
    assert noticed < TIMEOUT_S + 5, f"rank 0 noticed after {noticed:.1f}s"
    # rank 0's main thread notices through its collective; if it is busy longer than the keeper's
    # grace, the keeper (which watches the peers' processes) gives the job back instead
    assert f"a rank left the group during job {job.id}; re-queued, exiting" in text or (
        f"died and the main thread is stuck; job {job.id} re-queued" in text
    )
    assert_exactly_once(output, 4)
    finished = Job.fetch(job.id, connection=conn, serializer=JSONSerializer)
    assert finished.get_status() == "finished"
    print(f"rank 0 noticed the dead rank {noticed:.1f}s after SIGKILL")


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_a_stuck_rank_0_gives_the_job_back_when_a_peer_dies(
    env: dict[str, str], conn: redis.Redis, tmp_path: Path
) -> None:
    """On NCCL rank 0 can wait in CUDA for a dead peer and never see an error; its keeper thread
    watches the peers' processes and re-queues the job. Here rank 0 hangs on purpose."""
    output = enqueue(tmp_path, ["stuck test 0", "stuck test 1"], TINY_FLAGS, "--chunk-size", "2")
    log = tmp_path / "group.log"
    hang = {**env, "DIFFQ_FAULT_GROUP_HANG": f"0:{tmp_path / 'hung-once'}"}
    group = subprocess.Popen(
        torchrun("--data-parallel-degree", "2", "--burst", restarts=1),
        env=hang,
        cwd=ROOT,
        stdout=open(log, "ab"),  # noqa: SIM115 - the process owns it until it exits
        stderr=subprocess.STDOUT,
    )
    try:
        rank1 = wait_for(lambda: _pid_of_rank(log, 1), 600, "rank 1 to start")
        wait_for(lambda: "injected hang" in log.read_text(errors="replace"), 120, "rank 0 to hang")
        os.kill(rank1, signal.SIGKILL)
        killed = time.monotonic()
        assert group.wait(timeout=200) == 0, log.read_text()[-4000:]
        recovered = time.monotonic() - killed
    finally:
        kill(group)
    text = log.read_text()
    assert "died and the main thread is stuck; job" in text and "re-queued, exiting" in text, text[-3000:]
    assert_exactly_once(output, 2)
    # without the keeper: 30 s until torchrun's SIGKILL, then 30 s of heartbeat TTL and the reaper
    assert recovered < 45, f"the job was done {recovered:.1f}s after the kill"
    print(f"job finished {recovered:.1f}s after rank 1 was killed while rank 0 was stuck")


@pytest.mark.slow
@pytest.mark.long
def test_sigterm_finishes_the_current_job_on_all_ranks(env: dict[str, str], conn: redis.Redis, tmp_path: Path) -> None:
    enqueue(tmp_path, [f"sigterm test {i}" for i in range(4)], SLOW, "--chunk-size", "2")
    log = tmp_path / "group.log"
    group = start_group(env, log, "--data-parallel-degree", "2")
    try:
        job = wait_for(lambda: _running(conn), 120, "a job to be denoising")
        group.send_signal(signal.SIGTERM)
        group.wait(timeout=60)
    finally:
        kill(group)
    text = log.read_text()
    assert Job.fetch(job.id, connection=conn, serializer=JSONSerializer).get_status() == "finished", text[-3000:]
    assert "rank 1: stop from rank 0 (exit 0)" in text
    assert "re-queued" not in text
    assert len(FinishedJobRegistry("diffq", connection=conn).get_job_ids()) == 1  # no new job taken
    assert conn.llen("rq:queue:diffq") == 1


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.soak
def test_sigterm_with_redis_down_ends_every_rank_within_40s(
    env: dict[str, str], tmp_path: Path, aof_redis: RedisServer
) -> None:
    """Stopping wins over Redis for a group too: rank 0 gives up on a dead Redis within its
    grace, tells the other ranks to stop, and torchrun exits; the job comes back by heartbeat."""
    env = {**env, "REDIS_URL": aof_redis.url}
    conn = redis.Redis.from_url(aof_redis.url)
    enqueue_to(aof_redis.url, tmp_path, [f"redis down {i}" for i in range(4)])
    log = tmp_path / "group.log"
    group = start_group(env, log, "--data-parallel-degree", "2")
    try:
        wait_for(lambda: _running(conn), 600, "a job to be denoising")
        aof_redis.stop()
        wait_for(lambda: "Redis unreachable" in log.read_text(), 120, "rank 0 to miss Redis")
        group.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        group.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        kill(group)
    print(f"group exited {took:.1f}s after SIGTERM with Redis down")
    assert took < 40, log.read_text()[-3000:]
    text = log.read_text()  # torchrun itself prints a SignalException traceback on SIGTERM; our ranks none
    assert not re.search(r'File "[^"]*/(worker|common)/', text), text[-3000:]


def enqueue_to(url: str, tmp_path: Path, prompts: list[str]) -> None:
    path = tmp_path / "prompts.csv"
    path.write_text("prompt\n" + "".join(f"{p}\n" for p in prompts))
    flags = (*SLOW, "--chunk-size", "2", "--redis-url", url, "--output", tmp_path / "out")
    result = producer("enqueue", path, *flags)
    assert result.exit_code == 0, result.output
