"""A group's decoder split by rows over its ranks (worker/group/split_decode.py), on 2 and 4 CPU
ranks over gloo: each rank decodes its rows and every rank returns the whole image, the whole
decode's to float precision; a latent whose rows do not divide decodes whole; inside ``alone``
each rank decodes its own images by itself (an SDXL CFG pair's even part). A compiled decoder
(``compile-vae``, into precompiled files as in a group) stays compiled for whole decodes, and its
split twin compiles with the collectives inside one graph, to the same pixels. A rank's split
decode holds less memory at its peak than a whole decode (in bf16, as a FLUX group decodes)."""

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


@pytest.mark.slow  # torchrun and a decoder per rank: 7-64 s on 2 cores
@pytest.mark.parametrize(
    ("ranks", "compiled"),
    [
        pytest.param(2, "eager", marks=pytest.mark.long),
        pytest.param(4, "eager", marks=pytest.mark.long),
        pytest.param(2, "compiled", marks=pytest.mark.long),
    ],
)
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


MEMORY = r"""
import os, sys, weakref
import torch, torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
sys.path[:0] = [sys.argv[1]]
from diffusers import AutoencoderKL
from worker.group import split_decode


class Peak(TorchDispatchMode):
    # the bytes of the storages that ops make inside it, live at once at most (what a CUDA
    # allocator would hold for them; a CPU kernel's own scratch is not seen)
    def __init__(self, *already: torch.Tensor) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen = {t.untyped_storage().data_ptr() for t in already}

    def _free(self, key: int, n: int) -> None:
        self.seen.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.seen:
                storage = t.untyped_storage()
                key, n = storage.data_ptr(), storage.nbytes()
                self.seen.add(key)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(storage, self._free, key, n)
        return out


dist.init_process_group("gloo")
rank = dist.get_rank()
# parts as a 2048² image's largest activations take them: here 8 parts of one group each
split_decode._SplitGroupNorm.part_bytes = 4096
torch.manual_seed(0)
vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
                    layers_per_block=1, norm_num_groups=8, down_block_types=("DownEncoderBlock2D",) * 2,
                    up_block_types=("UpDecoderBlock2D",) * 2).eval().to(torch.bfloat16)
z = torch.randn(1, 4, 32, 32, dtype=torch.bfloat16)
with torch.inference_mode():
    with Peak(z) as whole_peak:
        whole = vae.decode(z).sample
    assert split_decode.install(vae, dist.group.WORLD)
    with Peak(z) as split_peak:
        split = vae.decode(z).sample
    norm = vae.decoder.twin.up_blocks[1].resnets[0].norm1
    x = torch.randn(1, 64, 16, 32, dtype=torch.bfloat16)  # a rank's half of 32 rows
    with Peak(x) as norm_peak:
        normed = norm(x)
    halves = x.new_empty(2, *x.shape)
    dist.all_gather_into_tensor(halves.flatten(), x.flatten())
    every = torch.cat(list(halves), 2)
    weight, bias = norm.norm.weight.float(), norm.norm.bias.float()
    reference = torch.nn.functional.group_norm(every.float(), 8, weight, bias, norm.norm.eps)
    error = (normed.float() - reference[:, :, rank * 16 : (rank + 1) * 16]).abs().max().item()
    image_error = (split.float() - whole.float()).abs().max().item()
print(f"rank {rank}: whole {whole_peak.peak} split {split_peak.peak} norm {norm_peak.peak} input {x.nbytes} "
      f"error {error:.4f} image {image_error:.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow  # torchrun
@pytest.mark.long
def test_a_ranks_split_decode_holds_less_memory_than_a_whole_decode(tmp_path: Path) -> None:
    """bf16, as a FLUX group decodes (eager): each GroupNorm holds one fp32 copy of a part of its
    groups at a time, so a rank's half of the rows peaks below one GPU's whole decode (before, the
    fp32 copies of whole activations put it 1.8 times above here, and 1.5 GiB above at 2048²)."""
    script = tmp_path / "memory.py"
    script.write_text(MEMORY)
    run = run_ranks(script, str(ROOT), ranks=2)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = re.findall(
        r"rank (\d): whole (\d+) split (\d+) norm (\d+) input (\d+) error ([\d.]+) image ([\d.]+)", run.stdout
    )
    assert sorted(line[0] for line in lines) == ["0", "1"], run.stdout
    for _, whole, split, norm, size, error, image in lines:
        assert int(split) < 0.75 * int(whole), (split, whole)
        assert int(norm) <= 1.3 * int(size), (norm, size)  # its output, and one group of eight in fp32
        assert float(error) <= 1 / 64, error  # bf16's rounding of the normalised values (|x| < 4)
        # within three bf16 steps of the whole decode (1/128 near 1; the image spans [-1, 1]): its
        # GroupNorms' parts round apart from the whole's by a step or two, by the CPU's bf16 kernels
        assert float(image) <= 3 / 128, image
