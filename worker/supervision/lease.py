"""GPU leases in Redis, so ``docker compose up --scale worker=N`` puts N workers on N distinct GPUs.

Compose cannot give each replica its own device: a ``count: 1`` reservation does not spread
replicas over GPUs. So every replica sees all GPUs of the host and, before it imports torch,
takes the first free index with ``SET diffq:gpu-lease:<host>:<index> <owner> NX EX 30``. It
pins itself with ``CUDA_VISIBLE_DEVICES`` and renews the lease from its own thread, from the
moment it is taken: importing torch and loading the model come before the worker's keeper, and
four replicas starting on a loaded two-core host took longer than the lease lives. A replica
that dies stops renewing, so its GPU is free again within :data:`LEASE_TTL_S`.
Replicas beyond the number of GPUs wait for a lease instead of doubling up on a GPU.

``<host>`` must be the same for every replica on one machine and differ between machines.
It comes from ``DIFFQ_LEASE_SCOPE``, or else Slurm's node name (``SLURMD_NODENAME``: several
jobs on one node see the same indices), or else ``/etc/machine-id`` (compose mounts it
read-only), or else the hostname.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import redis

from common.errors import ConfigError

log = logging.getLogger("diffq.worker")

LEASE_TTL_S = 30
RETRY_S = 5.0

#: renew only while the lease is still ours (a Lua script: check and extend in one step)
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def lease_scope(explicit: str = "") -> str:
    if explicit:
        return explicit
    machine_id = Path("/etc/machine-id")
    try:
        text = machine_id.read_text().strip()
    except OSError:
        text = ""
    return text[:12] or socket.gethostname()


def lease_key(scope: str, index: str) -> str:
    return f"diffq:gpu-lease:{scope}:{index}"


def candidates(spec: str, count_gpus: int | None = None) -> list[str]:
    """``all`` → every GPU nvidia-smi lists; ``0,1,3`` → those."""
    from worker.supervision.launch import _count_gpus  # nvidia-smi, no torch

    spec = spec.strip()
    if spec == "all":
        count = _count_gpus() if count_gpus is None else count_gpus
        if count == 0:
            raise ConfigError("--gpu-lease all: nvidia-smi lists no GPU here; name indices (0,1) or drop --gpu-lease")
        return [str(i) for i in range(count)]
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"--gpu-lease {spec!r}: use all, or distinct GPU indices such as 0,1,2,3")
    return parts


@dataclass
class GpuLease:
    conn: redis.Redis
    scope: str
    indices: list[str]
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    #: what an index stands for, in what the lease says: a GPU, or on a CPU host (compose.cpu.yaml)
    #: one replica's slot, so that a CPU worker's log and name do not claim a GPU
    kind: str = "GPU"
    index: str | None = None
    #: set by the renewing thread when another owner holds the key; the keeper stops the worker
    lost: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    #: one Redis step at a time: a renewal racing :meth:`release` must not take the key back
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def try_acquire(self) -> str | None:
        for index in self.indices:
            if self.conn.set(lease_key(self.scope, index), self.owner, nx=True, ex=LEASE_TTL_S):
                self.index = index
                return index
        return None

    def acquire(self, wait: bool = True) -> str:
        """Take the first free GPU; with ``wait``, keep trying while all are held."""
        said = False
        while True:
            index = self.try_acquire()
            if index is not None:
                log.info("leased %s %s of host %s (lease %s, %ds, renewed while alive)", self.kind, index, self.scope,
                         lease_key(self.scope, index), LEASE_TTL_S)  # fmt: skip
                threading.Thread(target=self._keep, name="diffq-lease", daemon=True).start()
                return index
            if not wait:
                raise ConfigError(f"all {self.kind}s {','.join(self.indices)} of host {self.scope} are leased")
            if not said:
                log.warning("all %d %s(s) of host %s are leased; waiting for one to free up",
                            len(self.indices), self.kind, self.scope)  # fmt: skip
                said = True
            time.sleep(RETRY_S)

    def _keep(self) -> None:
        """Renew every sixth of the TTL until :meth:`release` or until another owner holds it."""
        failures = 0
        while not self._stop.wait(LEASE_TTL_S / 6):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    if not self.renew():
                        self.lost.set()
                        return
                failures = 0
            except redis.RedisError as exc:
                failures += 1
                if failures == 1:  # once per outage; the lease is taken back when Redis returns
                    log.warning("GPU lease %s: Redis did not answer (%s); renewing when it does",
                                self.index, exc.__class__.__name__)  # fmt: skip

    def renew(self) -> bool:
        """Extend the lease; False if it is no longer ours (expired and taken by another)."""
        if self.index is None:
            return False
        key = lease_key(self.scope, self.index)
        if self.conn.eval(_RENEW, 1, key, self.owner, LEASE_TTL_S):
            return True
        # expired while Redis was away: take it back if nobody else did
        return bool(self.conn.set(key, self.owner, nx=True, ex=LEASE_TTL_S))

    def release(self) -> None:
        self._stop.set()
        with self._lock:
            if self.index is not None:
                self.conn.eval(_RELEASE, 1, lease_key(self.scope, self.index), self.owner)
                self.index = None
