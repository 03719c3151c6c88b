"""FLUX split with diffusers' own context parallelism (worker/group/token_split.py, what a
Ulysses-only or ring-only FLUX group runs) on 2 CPU ranks over gloo with a FLUX small enough for
the CPU: Ulysses with diffusers' attention exchange and with ours in parts
(bench/context_parallel.py), and the ring with cuDNN's attention replaced by its CPU twin. What
the GPU groups rest on: each rank runs half of the tokens, the image is the one process's, a
block compiles as one graph with the collectives in it, and a ring block gathers the peers' keys
and values before its local attention and waits for them after it. The ring's attention alone
on 2 and 4 ranks is the whole sequence's attention."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ranks
from test_speedups import TINY_FLUX

ROOT = Path(__file__).resolve().parents[1]

RANK = r"""
import json, os, sys
import numpy as np, torch, torch.distributed as dist
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
from context_parallel import exchange_in_parts
from worker.group import token_split
from worker.pipelines.models import build_flux

dist.init_process_group("gloo")
arch, out, exchange = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
tokens = []

def make(pipe):
    generator = torch.Generator().manual_seed(3)
    return pipe("a red fox", width=64, height=64, num_inference_steps=2, guidance_scale=3.5,
                generator=generator, output_type="np").images[0]

def first_block_tokens(pipe):
    hook = lambda module, args, kwargs: tokens.append(kwargs["hidden_states"].shape[1])
    pipe.transformer.transformer_blocks[0].register_forward_pre_hook(hook, with_kwargs=True)

alone = build_flux(**arch, t5_vocab=None, clip_vocab=None)
first_block_tokens(alone)
one_process = make(alone)
pipe = build_flux(**arch, t5_vocab=None, clip_vocab=None)  # the same seed: the same weights
if exchange == "ring":
    from worker.group import ring_attention

    def cpu_twin(query, key, value):
        # cuDNN's attention as the ring calls it, on the CPU: (B, H, S, D) in and out, with the log-sum-exp
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value)

    ring_attention.cudnn_attention = cpu_twin
    token_split.RING_DEVICES = frozenset({"cuda", "cpu"})
token_split.split(pipe, "ring" if exchange == "ring" else "ulysses", dist.get_world_size(), "tiny-flux")
if exchange.startswith("parts"):
    exchange_in_parts(pipe, dist.get_world_size(), int(exchange[len("parts"):]))
first_block_tokens(pipe)
split = make(pipe)
pipe.transformer.compile_repeated_blocks(fullgraph=True)  # a graph break raises here
compiled = make(pipe)
np.save(f"{out}/rank{dist.get_rank()}.npy", np.stack([one_process, split, compiled]))
processors = sorted({type(p).__name__ for p in pipe.transformer.attn_processors.values()})
with open(f"{out}/rank{dist.get_rank()}.json", "w") as fh:  # not stdout: the two ranks' lines interleave there
    json.dump({"tokens": tokens, "processors": processors}, fh)
dist.destroy_process_group()
# as a group's ranks leave (worker/group/cli.py's _finish): not through the interpreter's finalization,
# where gloo's threads letting go of a collective's tensors can abort the process (bench/exit_abort.py)
sys.stdout.flush()
os._exit(0)
"""


#: 8 heads, so that 2 ranks take 2 of each of 2 parts (a head order mixed up shows)
EIGHT_HEADS = {**TINY_FLUX, "transformer": {**TINY_FLUX["transformer"], "num_attention_heads": 8}}


@pytest.mark.slow  # torchrun, two FLUX pipelines per rank and a compile: half a minute each on the CPU
@pytest.mark.parametrize("exchange", ["diffusers", "parts2", "ring"])
@pytest.mark.long
def test_diffusers_split_halves_the_flux_tokens_and_makes_the_one_process_image(tmp_path: Path, exchange: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if exchange == "ring":
        # where each compiled block issues and waits for its gather (compiled afresh: a cached graph prints no code)
        env |= {"TORCH_LOGS": "output_code", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    run = run_ranks(script, str(ROOT), json.dumps(EIGHT_HEADS), str(tmp_path), exchange, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:  # 2 steps alone, then 2 split and 2 compiled, where a rank sees half the tokens
        whole, _, *split = report["tokens"]
        assert len(split) == 4 and all(seen * 2 == whole for seen in split)
        processor = {"parts2": "ChunkedUlysses", "ring": "RingAttention"}.get(exchange, "FluxAttnProcessor")
        assert report["processors"] == [processor]
    for rank in (0, 1):
        one_process, split_image, compiled = np.load(tmp_path / f"rank{rank}.npy")
        assert np.abs(one_process - split_image).max() <= 1e-5
        assert np.abs(one_process - compiled).max() <= 1e-4
    if exchange == "ring":
        orders = gather_orders(run.stderr)
        assert orders and all(order == ["gather", "attend", "wait", "attend"] for order in orders), orders


def gather_orders(log: str) -> list[list[str]]:
    """For each graph rank 0 compiled that gathers: its gather, attentions and wait, in the
    order its output code runs them (only a call's line has ``.default(``)."""
    marks = {"all_gather_into_tensor.default(": "gather", "gather_peers.default(": "gather",
             "wait_tensor.default(": "wait",
             "_scaled_dot_product_flash_attention_for_cpu.default(": "attend"}  # fmt: skip
    graphs: list[list[str]] = []
    for line in log.splitlines():
        if not line.startswith("[rank0]") or "__output_code" not in line:
            continue
        if "def call(self, args)" in line:
            graphs.append([])
        elif graphs:
            graphs[-1] += [kind for mark, kind in marks.items() if mark in line]
    return [graph for graph in graphs if "gather" in graph]


RING = r"""
import os, sys
import torch, torch.distributed as dist
import torch.nn.functional as F
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
from worker.group import ring_attention

dist.init_process_group("gloo")
rank, world, how = dist.get_rank(), dist.get_world_size(), sys.argv[2]
ring_attention.cudnn_attention = lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
gather, attention = ring_attention.all_gather, ring_attention.ring_attention
if how == "bshd":  # the bench's experiment: cuDNN handed views of the tokens-first memory
    import ring_bshd

    attention = ring_bshd.ring_attention_bshd
if how == "whole":  # the bench's experiment: one attention over every rank's keys after the gather
    import ring_whole

    attention = ring_whole.ring_attention_whole
if how == "pull":  # the bench's experiment: the op the copy engines run on GPUs, over gloo here
    import peer_gather
    import torch._inductor.config as inductor_config

    peer_gather.register(dist.group.WORLD)
    gather, inductor_config.reorder_for_peak_memory = peer_gather.pull, False
torch.manual_seed(0)  # every rank draws the same whole sequence: [batch, tokens, heads, dim]
query, key, value = (torch.randn(2, 6 * world, 3, 16) for _ in range(3))
mine = slice(6 * rank, 6 * (rank + 1))
ring = lambda q, k, v: attention(q, k, v, dist.group.WORLD, gather)
whole = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (query, key, value))).transpose(1, 2)
for attend in [ring] + ([torch.compile(ring, fullgraph=True)] if how == "pull" else []):
    out = attend(query[:, mine], key[:, mine], value[:, mine])
    error = (out - whole[:, mine]).abs().max().item()
    assert out.shape == (2, 6, 3, 16) and error < 1e-5, (out.shape, error)
print(f"rank {rank}: {error:.2e}", flush=True)
dist.destroy_process_group()
# as a group's ranks leave (worker/group/cli.py's _finish): not through the interpreter's finalization,
# where gloo's threads letting go of a collective's tensors can abort the process (bench/exit_abort.py)
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow  # torchrun: 6-18 s each on 2 cores
@pytest.mark.parametrize(
    "ranks,how",
    [
        pytest.param(2, "all_gather", marks=pytest.mark.long),
        pytest.param(4, "all_gather", marks=pytest.mark.long),
        pytest.param(2, "pull", marks=pytest.mark.long),
        (2, "bshd"),
        pytest.param(2, "whole", marks=pytest.mark.long),
        pytest.param(4, "whole", marks=pytest.mark.long),
    ],
)
def test_ring_attention_over_every_rank_is_the_whole_sequences_attention(tmp_path: Path, ranks: int, how: str) -> None:
    """Each rank's queries against every rank's keys and values (the gather, the local attention
    and each peer's, merged by log-sum-exp) are one attention over the whole sequence; with the
    product's gather, with the bench's pull (bench/peer_gather.py), also compiled, where the pull
    is issued before the local attention and waited for after it, on the bench's tokens-first
    views (bench/ring_bshd.py), and as the bench's one attention over all keys (bench/ring_whole.py)."""
    script = tmp_path / "ring.py"
    script.write_text(RING)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if how == "pull":
        env |= {"TORCH_LOGS": "output_code", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    run = run_ranks(script, str(ROOT), how, ranks=ranks, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(re.findall(r"rank (\d+): ", run.stdout)) == [str(r) for r in range(ranks)], run.stdout
    if how == "pull":
        orders = gather_orders(run.stderr)
        assert orders == [["gather", "attend", "wait", "attend"]], orders
