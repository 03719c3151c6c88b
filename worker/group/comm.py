"""The group's control plane: rank 0's commands to every rank, and every rank's answer back.

It runs on its own gloo process group (CPU, TCP) with the group's timeout, apart from the
NCCL groups xDiT computes on: a command or an answer is a small pickled object (images come
back as PIL images, 3 MB at 1024²; rank 0's own stay where they are), and gloo turns a dead or
silent peer into an exception after ``timeout_s`` instead of a hang. Rank 0 is the only sender
of commands; it pings every :data:`PING_INTERVAL_S` while idle, so a follower waiting for work
never sits near the timeout.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from common.settings import torchrun

#: seconds between rank 0's pings while the queue is empty
PING_INTERVAL_S = 5.0
#: exit status of every rank when one died or went silent (the supervisor starts the group again)
EXIT_GROUP_LOST = 4


class GroupLost(Exception):
    """A peer died or did not answer within the timeout: the group cannot go on and exits."""


@dataclass
class Command:
    kind: str  # "batch" | "ping" | "stop"
    work: dict[str, Any] | None = None
    exit_code: int = 0


@dataclass
class Answer:
    rank: int
    dp_rank: int = 0
    images: list[Any] | None = None  # PIL images, from the rank that holds its dp group's result
    error: str | None = None  # "rank N: Class: first line" when this rank's part failed
    permanent: bool = False
    oom: bool = False
    stop: bool = False  # this rank was asked to stop (SIGTERM)
    timings: dict[str, float] = field(default_factory=dict)


def init_world(backend: str, timeout_s: float, store_timeout_s: float = 1800) -> None:
    """The world process group of the ranks torchrun started.

    Its keys live under a prefix of torchrun's run id and restart count: torchrun keeps one
    store across ``--max-restarts``, and a restarted rank must not find the addresses its dead
    predecessors published there (it would try to connect to them and fail)."""
    run = torchrun()
    store = dist.TCPStore(
        run.master_addr or "127.0.0.1",
        run.master_port,
        run.world_size,
        is_master=not run.agent_store and run.rank == 0,
        timeout=timedelta(seconds=store_timeout_s),
        multi_tenant=True,
    )
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"diffq/{run.run_id}/{run.restart_count}/", store),
        rank=run.rank,
        world_size=run.world_size,
        timeout=timedelta(seconds=timeout_s),
    )


class Control:
    def __init__(self, timeout_s: float) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.timeout_s = timeout_s
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))

    def broadcast(self, command: Command | None = None) -> Command:
        """Rank 0 sends ``command``; every other rank waits for it and returns it."""
        box = [command]
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except Exception as exc:  # gloo raises RuntimeError / DistBackendError on a dead or silent peer
            raise GroupLost(_why(exc, self.timeout_s)) from None
        return box[0]

    def gather(self, answer: Answer) -> list[Answer]:
        """Every rank's answer at rank 0 (others get an empty list).

        Rank 0's own answer does not travel: its images (3 MB at 1024²) would be pickled and sent
        to itself, and gloo pads every rank's part to the largest, so each other rank would send
        as many bytes of nothing. On 2 CPU ranks (``bench/answer_gather.py``) a round with a 1024²
        image at rank 0 took 6.2-7.0 ms sent, 0.8 ms kept; a CFG pair's job at batch 1 takes
        0.65 s on H200s, where the queue's whole share was 24 ms."""
        sent = replace(answer, images=None) if self.rank == 0 else answer
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        try:
            dist.gather_object(sent, out, dst=0, group=self.group)
        except Exception as exc:
            raise GroupLost(_why(exc, self.timeout_s)) from None
        if out is None:
            return []
        out[0] = answer
        return list(out)


def _why(exc: BaseException, timeout_s: float) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else exc.__class__.__name__
    if "timed out" in first.lower() or "timeout" in first.lower():
        return f"a rank did not answer within the group timeout ({timeout_s:g}s): {first[:200]}"
    return f"a rank left the group: {first[:200]}"


def publish_pid() -> None:
    """Tell rank 0 where this rank runs (host and pid), for the keeper's liveness checks."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"pid/{dist.get_rank()}", f"{socket.gethostname()}:{os.getpid()}")


def local_peers() -> list[int]:
    """The pids of the other ranks on this host (torchrun starts them all here on one node)."""
    store = dist.distributed_c10d._get_default_store()
    here = socket.gethostname()
    peers = []
    for rank in range(1, dist.get_world_size()):
        host, _, pid = store.get(f"pid/{rank}").decode().rpartition(":")
        if host == here:
            peers.append(int(pid))
    return peers


def local_rank() -> int:
    return torchrun().local_rank
