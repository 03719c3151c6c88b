"""A group's decoder split by rows over its ranks (worker/group/split_decode.py), on 2 and 4 CPU
ranks over gloo: each rank decodes its rows and every rank returns the whole image, the whole
decode's to float precision; a latent whose rows do not divide decodes whole; inside ``alone``
each rank decodes its own images by itself (an SDXL CFG pair's even part). A compiled decoder
(``compile-vae``, into precompiled files as in a group) stays compiled for whole decodes, and its
split twin compiles with the collectives inside one graph, to the same pixels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_ranks

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
compiled = sys.argv[2] == "compiled"
# compiled, one split shape and one whole (each shape is a compile of its own, tens of seconds here)
# (4 rows over 4 ranks: one latent row a rank, its neighbours' rows on both sides of it)
latents = {rows: torch.randn(2, 4, rows, 6) for rows in ((8,) if compiled else (8, 12, 7, 4))}
with torch.no_grad():
    whole = {rows: vae.decode(z).sample for rows, z in latents.items()}
    if compiled:  # as compile-vae leaves it in a group (worker/pipelines/warm.py: into precompiled files)
        from pathlib import Path
        from worker.pipelines import precompiled
        precompiled.install(vae.decoder, precompiled.Store(Path(sys.argv[3]) / f"rank{rank}"), {"model": "test"})
    lazily = torch.nn.Conv2d(1, 1, 1)
    lazily.compile()  # compile-vae without precompiled files (nothing is traced until a call)
    assert split_decode._compiled(lazily) and not split_decode._compiled(torch.nn.Conv2d(1, 1, 1))
    assert split_decode.install(vae, dist.group.WORLD) and not split_decode.install(vae, dist.group.WORLD)
    twin = vae.decoder.twin
    assert all(a is b for a, b in zip(vae.decoder.decoder.parameters(), twin.parameters()))  # no second copy
    assert (twin._compiled_call_impl is not None) == compiled and "forward" not in twin.__dict__
    assert ("forward" in vae.decoder.decoder.__dict__) == compiled  # the decoder keeps its precompiled forward
    for rows, z in latents.items():
        split = vae.decode(z).sample
        error = (split - whole[rows]).abs().max().item()
        assert split.shape == whole[rows].shape and error < 1e-5, (rows, split.shape, error)
        print(f"rank {rank} rows {rows}: {error:.1e}", flush=True)
    # alone: rank r decodes image r of a batch by itself; ranks beyond the batch decode nothing
    # (a collective here would wait for them for ever)
    if rank < 2:
        with split_decode.alone(vae):
            mine = vae.decode(latents[8][rank : rank + 1]).sample
        error = (mine - whole[8][rank : rank + 1]).abs().max().item()
        assert error < 1e-5, error
        print(f"rank {rank} alone: {error:.1e}", flush=True)
    assert not vae.decoder.alone
    dist.barrier()
dist.destroy_process_group()
# as a group's ranks leave (worker/group/cli.py's _finish): not through the interpreter's finalization,
# where gloo's threads letting go of a collective's tensors can abort the process (bench/exit_abort.py)
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.parametrize(("ranks", "compiled"), [(2, "eager"), (4, "eager"), (2, "compiled")])
def test_each_rank_decodes_its_rows_and_every_rank_has_the_whole_decode(
    tmp_path: Path, ranks: int, compiled: str
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    run = run_ranks(script, str(ROOT), compiled, str(tmp_path / "precompiled"), ranks=ranks)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = re.findall(r"rank (\d+) rows (\d+): ", run.stdout)
    sizes = ("8",) if compiled == "compiled" else ("8", "12", "7", "4")
    assert sorted(seen) == sorted((str(r), rows) for r in range(ranks) for rows in sizes), run.stdout
    assert sorted(re.findall(r"rank (\d+) alone: ", run.stdout)) == ["0", "1"], run.stdout
