"""The group's control plane (worker/group/comm.py) on 2 CPU ranks over gloo: rank 0's own
answer stays in rank 0's memory (its images, 3 MB at 1024², are not pickled and sent to itself
through gloo: 5-7 ms a job on this machine, a share of a CFG pair's 0.65 s job); another rank's
answer arrives whole, its images pixel for pixel."""

from __future__ import annotations

from pathlib import Path

from conftest import run_ranks

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import os, sys
import numpy as np
import torch.distributed as dist
from PIL import Image
sys.path[:0] = [sys.argv[1]]
from worker.group.comm import Answer, Command, Control

dist.init_process_group("gloo")
rank = dist.get_rank()
control = Control(timeout_s=60)
command = control.broadcast(Command("batch", {"prompts": ["a fox"]}) if rank == 0 else None)
assert command.kind == "batch" and command.work == {"prompts": ["a fox"]}, command
pixels = np.full((64, 48, 3), 10 + rank, dtype=np.uint8)
mine = Answer(rank=rank, images=[Image.fromarray(pixels)], timings={"denoise_s": 0.5 + rank})
answers = control.gather(mine)
if rank == 0:
    assert answers[0] is mine, "rank 0's own answer was copied through gloo"
    other = answers[1]
    assert other.rank == 1 and other.timings == {"denoise_s": 1.5}, other
    assert len(other.images) == 1 and np.array_equal(np.asarray(other.images[0]), pixels + 1 - rank)
    print("rank 0: answers checked", flush=True)
else:
    assert answers == [], answers
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


def test_rank_0_keeps_its_own_answer_and_gets_every_other_whole(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    run = run_ranks(script, str(ROOT), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rank 0: answers checked" in run.stdout, run.stdout
