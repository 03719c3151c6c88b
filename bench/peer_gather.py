"""Experiment: a ring rank's peers' keys and values pulled by the GPUs' copy engines, not
gathered by NCCL's kernels (``bench/group.py --pull-gather``; not the product's: it made the same
time).

Why it was tried: NCCL's all-gather runs as kernels on the SMs, beside the attention and
projections it hides behind. On 2 H200s (``fluxring6``) a ring rank's kernels took 2.30 s an
image overlapped against 2.19 s with the gather left alone. Beside two GEMMs of a FLUX block's
shape (``bench/copy_gather.py``, ``h200x2-copygather-call.jsonl``) 57 gathers of 28.3 MB added
7.1 ms to the GEMMs' 29.4 ms through NCCL, 3.1 ms pulled by the copy engines.

What it made (FLUX 1024², ring of 2, 2 H200s, one call, ``h200x2-fluxring7-call.jsonl``): the
same time as NCCL's gather (2.350 / 2.326 s against 2.341 / 2.363 s; one GPU 3.847 s). Profiled,
the GEMMs beside it lost nothing (1.27-1.29 s a rank, as with NCCL's gather not overlapped in
``fluxring6``, 1.33 s overlapped), but copies took 0.045 s a rank (0.017 s with NCCL: the copy
into the mapped buffer) and the GPU stood idle 0.155 s (0.10-0.13 s with NCCL in ``fluxring6``,
other H200s; its cause not traced), which took back what the GEMMs gained.

How, on CUDA: every rank copies its keys and values into a buffer that every rank of the group
has mapped (torch's symmetric memory), in stream order, so the caller's tensor is free when the
op returns; then, on a side stream, the ranks meet at a barrier, each copies its peers' buffers
into its output (``cudaMemcpyAsync`` over NVLink: the copy engines), and they meet again, so that
no rank writes its buffer for the next layer while a peer still reads it. The caller waits with
``wait_tensor`` (the pull is registered as in-flight work, as torch's collectives are). A buffer
is kept once mapped: a CUDA graph captured with it reads it at every replay. On the CPU (the
test's gloo ranks) the op gathers with ``all_gather``, so the ring compiles to the same graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

#: process groups by name: the op takes a name (an op's arguments are tensors and plain values)
_groups: dict[str, dist.ProcessGroup] = {}
#: (group name, device index) -> [(buffer, its symmetric-memory handle)], the largest last
_buffers: dict[tuple[str, int], list[tuple[torch.Tensor, Any]]] = {}
_side_streams: dict[int, torch.cuda.Stream] = {}


def register(group: dist.ProcessGroup) -> str:
    """The name :func:`gather_peers` takes for ``group``."""
    _groups[group.group_name] = group
    return group.group_name


def _buffer(name: str, nbytes: int, device: torch.device, symm_mem: Any) -> Any:
    held = _buffers.setdefault((name, device.index or 0), [])
    if held and held[-1][0].numel() >= nbytes:
        return held[-1][1]
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"gather_peers: a {nbytes}-byte buffer is first needed while a CUDA graph is captured")
    tensor = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(tensor, name)  # every rank at once: the same layer, the same size
    held.append((tensor, handle))
    return handle


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _side_streams:
        _side_streams[index] = torch.cuda.Stream(device=index)
    return _side_streams[index]


class _Pulled(torch._C._distributed_c10d.Work):
    """The pull as in-flight work: ``wait_tensor`` makes the waiting stream wait for the copies."""

    def __init__(self) -> None:
        super().__init__()
        self.done = torch.cuda.Event()
        self.done.record()  # on the side stream, after the last barrier

    def wait(self, timeout: Any = None) -> bool:
        self.done.wait()
        return True


@torch.library.custom_op("diffq::gather_peers", mutates_args=())
def gather_peers(kv: torch.Tensor, group_name: str) -> torch.Tensor:
    """``[world - 1, *kv.shape]``: every other rank's ``kv``, this rank's next first. In flight
    when it returns: ``torch.ops._c10d_functional.wait_tensor`` it before reading."""
    group = _groups[group_name]
    world, rank = group.size(), group.rank()
    out = kv.new_empty((world - 1, *kv.shape))
    if kv.device.type != "cuda":
        every = kv.new_empty(world * kv.numel())
        dist.all_gather_into_tensor(every, kv.contiguous().flatten(), group=group)
        every = every.view(world, *kv.shape)
        for step in range(1, world):
            out[step - 1].copy_(every[(rank + step) % world])
        return out
    import torch.distributed._symmetric_memory as symm_mem

    mem = _buffer(group_name, kv.numel() * kv.element_size(), kv.device, symm_mem)
    mem.get_buffer(rank, kv.shape, kv.dtype).copy_(kv)
    side = _side_stream(kv.device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        mem.barrier()
        for step in range(1, world):
            out[step - 1].copy_(mem.get_buffer((rank + step) % world, kv.shape, kv.dtype))
        mem.barrier()
        torch._C._distributed_c10d._register_work(out, _Pulled())
    return out


@gather_peers.register_fake
def _(kv: torch.Tensor, group_name: str) -> torch.Tensor:
    return kv.new_empty((_groups[group_name].size() - 1, *kv.shape))


def pull(kv: torch.Tensor, group: dist.ProcessGroup) -> Callable[[], list[torch.Tensor]]:
    """A :data:`worker.group.ring_attention.Gather`: the pull issued here, waited for where the
    peers' part is first read."""
    pulled = torch.ops.diffq.gather_peers(kv, group.group_name)
    return lambda: list(torch.ops._c10d_functional.wait_tensor(pulled).unbind(0))


def use(pipe: Any) -> int:
    """Every ring attention of ``pipe``'s transformer pulls; returns how many. Inductor does not
    know the op for a collective: it keeps it where the ring issues it, unless its reordering for
    peak memory moves it after the local attention (it did on 2 CPU ranks), so that is off."""
    import torch._inductor.config as inductor_config

    from worker.group.ring_attention import RingAttention

    inductor_config.reorder_for_peak_memory = False
    rings = [p for p in pipe.transformer.attn_processors.values() if isinstance(p, RingAttention)]
    for ring in rings:
        register(ring.group)
        ring.gather = pull
    return len(rings)
