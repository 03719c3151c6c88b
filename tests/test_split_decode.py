"""A token-split group's decoder split by rows over its ranks (worker/group/split_decode.py), on
2 and 4 CPU ranks over gloo: each rank decodes its rows and every rank returns the whole image,
the whole decode's to float precision; a latent whose rows do not divide decodes whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import os, sys
import torch, torch.distributed as dist
sys.path[:0] = [sys.argv[1]]
from diffusers import AutoencoderKL
from worker.group import split_decode

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)  # every rank builds the same weights and draws the same latents
# two levels (an upsampler between them), GroupNorm of 4 groups, a channel change, the middle attention
vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16),
                    layers_per_block=1, norm_num_groups=4, down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2).eval()
latents = {rows: torch.randn(2, 4, rows, 6) for rows in (8, 12, 7)}
with torch.no_grad():
    whole = {rows: vae.decode(z).sample for rows, z in latents.items()}
    assert split_decode.install(vae, dist.group.WORLD) and not split_decode.install(vae, dist.group.WORLD)
    for rows, z in latents.items():
        split = vae.decode(z).sample
        error = (split - whole[rows]).abs().max().item()
        assert split.shape == whole[rows].shape and error < 1e-5, (rows, split.shape, error)
        print(f"rank {rank} rows {rows}: {error:.1e}", flush=True)
dist.destroy_process_group()
# as a group's ranks leave (worker/group/cli.py's _finish): not through the interpreter's finalization,
# where gloo's threads letting go of a collective's tensors can abort the process (bench/exit_abort.py)
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_decodes_its_rows_and_every_rank_has_the_whole_decode(tmp_path: Path, ranks: int) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    run = subprocess.run(
        [*command, str(script), str(ROOT)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    seen = re.findall(r"rank (\d+) rows (\d+): ", run.stdout)
    assert sorted(seen) == sorted((str(r), rows) for r in range(ranks) for rows in ("8", "12", "7")), run.stdout
