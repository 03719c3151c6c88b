"""How a job's images are cut into batches (``run_split``): padded up to a compiled size,
halved on out-of-memory, and always one image per row back, in order. Pure logic: a recording
stand-in for the pipeline call."""

from __future__ import annotations

import torch

from common.jobspec import GenParams
from worker.pipelines.generate import run_split
from worker.pipelines.pixels import BatchResult
from worker.pipelines.warm import padding

PARAMS = GenParams(model="tiny", width=64, height=64, steps=2, guidance=5.0)


class Recorder:
    """Runs a "batch" by returning its seeds as images; out of memory above ``fits`` rows."""

    def __init__(self, fits: int = 99) -> None:
        self.fits, self.batches = fits, []

    def __call__(self, pipe, params, prompts, negatives, seeds, on_step=None) -> BatchResult:
        if len(seeds) > self.fits:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        self.batches.append(list(seeds))
        return BatchResult(images=list(seeds), encode_s=0.0, denoise_s=0.0, decode_s=0.0)


def split(n: int, max_batch: int, compiled: set[int] | None, fits: int = 99) -> tuple[list, list, int]:
    run = Recorder(fits)
    seeds = list(range(100, 100 + n))
    pad_to = padding(compiled) if compiled is not None else None
    result, fitted = run_split(
        None, PARAMS, [f"p{s}" for s in seeds], [""] * n, seeds, max_batch, run=run, pad_to=pad_to
    )
    return result.images, run.batches, fitted


def test_a_tail_chunk_is_padded_up_to_the_compiled_batch_and_the_padding_dropped():
    images, batches, _ = split(3, max_batch=8, compiled={8})
    assert batches == [[100, 101, 102, 102, 102, 102, 102, 102]]
    assert images == [100, 101, 102]


def test_without_compiled_graphs_nothing_is_padded():
    assert split(3, max_batch=8, compiled=None)[1] == [[100, 101, 102]]


def test_a_job_larger_than_the_batch_runs_in_compiled_batches_with_only_the_last_padded():
    images, batches, _ = split(10, max_batch=4, compiled={4})
    assert [len(b) for b in batches] == [4, 4, 4]
    assert batches[-1] == [108, 109, 109, 109]
    assert images == list(range(100, 110))


def test_the_smallest_compiled_size_that_holds_the_rows_is_used():
    assert split(2, max_batch=8, compiled={8, 3})[1] == [[100, 101, 101]]


def test_after_out_of_memory_the_halves_are_padded_only_up_to_the_size_that_fit():
    images, batches, fitted = split(7, max_batch=8, compiled={8}, fits=4)
    assert fitted == 4
    assert [len(b) for b in batches] == [4, 4]  # 4 + 3 padded to 4: one new graph, not two
    assert images == list(range(100, 107))
