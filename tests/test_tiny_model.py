"""The tiny model (and its adapter), written on first use, is whole whichever process writes it: under torchrun
every rank of a group may (transformers 5 writes a model's weights only on rank 0 of an
initialised process group, and a rank 1 that won the race left text encoders without weights in
a folder marked complete, so every later load failed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, run_ranks

RANK = r"""
import os, sys
import torch.distributed as dist
sys.path[:0] = [sys.argv[1]]
from diffusers import StableDiffusionXLPipeline
from worker.pipelines.models import ensure_tiny, ensure_tiny_dora

dist.init_process_group("gloo")
rank = dist.get_rank()
own = ensure_tiny(os.path.join(sys.argv[2], f"rank{rank}"))  # each rank writes one: rank 1's too
dist.barrier()
shared = ensure_tiny(os.path.join(sys.argv[2], "shared"))  # both at once, as a group's first load
for folder in (own, shared):
    pipe = StableDiffusionXLPipeline.from_pretrained(folder)
pipe.load_lora_weights(ensure_tiny_dora(os.path.join(sys.argv[2], f"rank{rank}")))  # the adapter too
print(f"rank {rank} loaded", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow  # torchrun
@pytest.mark.long
def test_every_rank_of_a_group_writes_a_whole_tiny_model(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    run = run_ranks(script, str(ROOT), str(tmp_path / "cache"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(run.stdout.split("\n")[:-1]) == ["rank 0 loaded", "rank 1 loaded"], run.stdout
