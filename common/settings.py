"""Settings: one typed object built once from command-line flags and the environment.

This is the only module that reads ``os.environ`` (the GPU pinning in ``worker/supervision/launch.py``
*writes* it for child processes, before they import torch). Every name below works the
same inside and outside containers; ``.env.example`` lists them with their defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from common.errors import ConfigError
from common.presets import DEFAULT_MODEL, OFFLOAD_MODES, PRECISIONS, speedup_names

#: the environment variable of each setting that has one (20 ``DIFFQ_*`` and ``REDIS_URL``:
#: what a deployment sets once for every process, in .env); the others are flags of the command
#: that uses them (``--dtype``, ``--keep-finished``, a group's ``--ulysses-degree``, ...).
#: docs/usage.md's settings table lists exactly these (tests/test_docs.py checks it).
ENV_NAMES: dict[str, str] = {
    "redis_url": "REDIS_URL",
    "queue": "DIFFQ_QUEUE",
    "output": "DIFFQ_OUTPUT",
    "output_root": "DIFFQ_OUTPUT_ROOT",
    "s3_endpoint_url": "DIFFQ_S3_ENDPOINT_URL",
    "model": "DIFFQ_MODEL",
    "cache_dir": "DIFFQ_CACHE",
    "device": "DIFFQ_DEVICE",
    "speedups": "DIFFQ_SPEEDUPS",
    "precision": "DIFFQ_PRECISION",
    "gpu_label": "DIFFQ_GPU",
    "gpu_lease": "DIFFQ_GPU_LEASE",
    "lease_scope": "DIFFQ_LEASE_SCOPE",
    "chunk_size": "DIFFQ_CHUNK_SIZE",
    "max_queued": "DIFFQ_MAX_QUEUED",
    "heartbeat_ttl": "DIFFQ_HEARTBEAT_TTL",
    "log_level": "DIFFQ_LOG_LEVEL",
    "compile_cache": "DIFFQ_COMPILE_CACHE",
    "offload": "DIFFQ_OFFLOAD",
    "gpu_memory": "DIFFQ_GPU_MEMORY",
    "metrics_port": "DIFFQ_METRICS_PORT",
}

DTYPES = ("auto", "float32", "float16", "bfloat16")
REDIS_SCHEMES = ("redis", "rediss", "unix")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class Settings:
    redis_url: str = "redis://localhost:6379/0"
    queue: str = "diffq"
    output: str = "out"
    #: workers refuse jobs whose output folder is not under this one (empty: any folder)
    output_root: str = ""
    #: S3-compatible endpoint for s3:// outputs (MinIO, Ceph, R2...); empty: AWS or AWS_ENDPOINT_URL
    s3_endpoint_url: str = ""
    model: str = DEFAULT_MODEL
    cache_dir: str = str(Path.home() / ".cache" / "diffq")
    device: str = "auto"
    dtype: str = "auto"
    speedups: str = "auto"
    #: fp16 (the weights' dtype) or fp8 (worker/pipelines/fp8.py); common/presets.PRECISIONS
    precision: str = "fp16"
    gpu_label: str = ""
    #: lease one GPU of these (``all`` or ``0,1,2,3``) in Redis instead of being pinned from outside
    gpu_lease: str = ""
    #: the host name leases are scoped by (default: Slurm's node name, else /etc/machine-id, else
    #: the hostname)
    lease_scope: str = ""
    chunk_size: int = 8
    #: jobs ``producer enqueue`` keeps queued at most; past it, it waits for workers to take some
    #: (a 10^7-image file is 1.25 M jobs, ~1.8 GB of Redis if queued at once). 0: no limit
    max_queued: int = 100_000
    #: finished jobs (hash and result) kept for rq-dashboard; older ones are deleted, since the
    #: ledger and the counters hold what a campaign needs. 0: keep them for RQ's result TTL
    keep_finished: int = 10_000
    job_timeout: int = 3600
    max_retries: int = 3
    #: seconds before the 1st, 2nd, ... retry of a transient failure (the last repeats)
    retry_backoff: str = "5,30,120"
    #: seconds without a heartbeat after which a running job is taken for dead and given to
    #: another worker; the keeper renews every sixth of it and looks for dead ones every third
    heartbeat_ttl: int = 30
    log_level: str = "INFO"
    #: write a job's images and record them on a writer thread while the next job denoises
    #: (worker/serving/overlap.py); 0 writes them before the job function returns
    overlap_save: bool = True
    #: where torch.compile's artifacts are shared: ``local`` (this host's cache folder only),
    #: ``redis`` (also the queue's Redis, so a new host of the fleet loads what another compiled)
    #: or a redis:// URL of another Redis
    compile_cache: str = "local"
    #: keep the compiled UNet and VAE decoder as files (worker/pipelines/precompiled.py), so a
    #: restarted worker loads them instead of tracing again; 0: torch.compile's lazy way only
    precompile: bool = True
    #: where the pipeline's weights live between uses (worker/pipelines/offload.py): ``none`` (on
    #: the GPU), ``model`` (on the CPU, one component at a time on the GPU), ``sequential`` (one
    #: layer at a time) or ``auto`` (the lightest that fits the GPU's memory with a batch)
    offload: str = "auto"
    #: GiB of the GPU this worker may use (0: all that is free); for a shared GPU, or to rehearse
    #: a smaller one on a big one
    gpu_memory: float = 0.0
    #: a worker serves Prometheus metrics on this port (0: off; ``worker launch`` gives each of
    #: its workers the next one)
    metrics_port: int = 0
    #: a group takes only its campaign's group lane (``producer enqueue --latency``, and jobs too
    #: big for a single worker), never the shared queue: kept free for the jobs that need it
    group_jobs_only: bool = False

    @staticmethod
    def visible_devices() -> list[str] | None:
        """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` lists them (indices, UUIDs
        or MIG ids), or None when it is not set. Slurm's ``--gres=gpu:N`` / ``--gpus-per-node``
        set it for a job; an empty value means no GPU at all."""
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
        if raw is None:
            return None
        return [part.strip() for part in raw.split(",") if part.strip()]

    @classmethod
    def load(cls, **flags: Any) -> Settings:
        """Defaults, overridden by the environment, overridden by flags that were given (not None)."""
        values: dict[str, Any] = {}
        known = {f.name: f for f in fields(cls)}
        for name, variable in ENV_NAMES.items():
            raw = os.environ.get(variable)
            if raw not in (None, ""):
                values[name] = _convert(name, raw, known[name].type, source=variable)
        for name, value in flags.items():
            if name not in known:
                raise TypeError(f"unknown setting {name}")
            if value is not None:
                values[name] = value
        if not values.get("gpu_label"):
            values["gpu_label"] = os.environ.get("CUDA_VISIBLE_DEVICES", "") or "-"
        if not values.get("lease_scope"):
            # under Slurm, leases are scoped by the node (jobs on one node share its GPUs' indices)
            values["lease_scope"] = os.environ.get("SLURMD_NODENAME", "")
        return cls(**values).validate()

    def validate(self) -> Settings:
        if self.device not in DEVICES:
            raise ConfigError(f"--device {self.device!r}: use one of {', '.join(DEVICES)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")
        if self.chunk_size < 1 or self.chunk_size > 256:
            raise ConfigError(f"--chunk-size {self.chunk_size}: use 1..256")
        if self.max_queued < 0:
            raise ConfigError(f"--max-queued {self.max_queued}: use 0 (no limit) or more")
        if self.keep_finished < 0:
            raise ConfigError(f"--keep-finished {self.keep_finished}: use 0 (RQ's TTL) or more")
        if self.job_timeout < 10:
            raise ConfigError(f"--job-timeout {self.job_timeout}: use at least 10 seconds")
        if not self.queue or ":" in self.queue or len(self.queue) > 100:
            raise ConfigError(f"--queue {self.queue!r}: use a short name without ':'")
        if not 6 <= self.heartbeat_ttl <= 3600:
            raise ConfigError(f"DIFFQ_HEARTBEAT_TTL={self.heartbeat_ttl}: use 6..3600 seconds")
        if not 0 <= self.max_retries <= 100:
            raise ConfigError(f"--max-retries {self.max_retries}: use 0..100")
        self.retry_intervals()
        if self.offload not in OFFLOAD_MODES:
            raise ConfigError(f"--offload {self.offload!r}: use one of {', '.join(OFFLOAD_MODES)}")
        if self.gpu_memory < 0:
            raise ConfigError(f"--gpu-memory {self.gpu_memory}: use GiB above 0, or 0 for all that is free")
        speedup_names(self.speedups)  # a typo is one line at start-up, before a GPU is leased
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        scheme = urlsplit(self.redis_url).scheme
        if scheme not in REDIS_SCHEMES:
            raise ConfigError(
                f"--redis-url {redact(self.redis_url)!r}: use redis://[user:password@]host:port/db or rediss://"
            )
        if is_placeholder(urlsplit(self.redis_url).password):
            raise ConfigError(
                "REDIS_PASSWORD (in --redis-url / REDIS_URL) is still .env.example's placeholder: "
                "set a password of your own in .env and recreate the stack (docker compose up -d)"
            )
        if self.compile_cache not in ("local", "redis") and urlsplit(self.compile_cache).scheme not in REDIS_SCHEMES:
            raise ConfigError(
                f"--compile-cache {redact(self.compile_cache)!r}: use local, redis (the queue's Redis) "
                "or a redis:// URL"
            )
        return self

    def compile_cache_url(self) -> str | None:
        """The Redis that torch's remote compile caches use, or None for the local folder only."""
        if self.compile_cache == "local":
            return None
        return self.redis_url if self.compile_cache == "redis" else self.compile_cache

    def retry_intervals(self) -> list[int]:
        try:
            values = [int(v) for v in self.retry_backoff.split(",")]
        except ValueError:
            values = []
        if not values or any(v < 0 for v in values):
            raise ConfigError(f"--retry-backoff {self.retry_backoff!r}: use seconds before each retry, e.g. 5,30,120")
        return values

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes).validate()


def _convert(name: str, raw: str, annotation: Any, *, source: str) -> Any:
    if annotation in (bool, "bool"):
        text = raw.strip().lower()
        if text not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ConfigError(f"{source}={raw!r}: use 1 or 0")
        return text in ("1", "true", "yes", "on")
    if annotation in (float, "float"):
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{source}={raw!r}: {name} must be a number") from None
    if annotation in (int, "int"):
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{source}={raw!r}: {name} must be a whole number") from None
    return raw


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, for logs and status output."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def point_compile_cache_at(cache_dir: str | Path) -> Path:
    """Point torch's compile cache (Inductor's kernels, and Dynamo's record of which dimensions
    vary) at ``<cache_dir>/inductor``, beside the models, so it lives as long as they do and a
    restarted worker finds it; unless the user chose a folder with ``TORCHINDUCTOR_CACHE_DIR``.

    Importing diffusers makes torch fill that variable with its own default
    (``/tmp/torchinductor_<user>``), so a value equal to that default counts as unset.

    Triton's own cache (the FP8 convolution's kernels and their autotuning, which Inductor does
    not hold) goes to ``<cache_dir>/triton`` the same way, unless ``TRITON_CACHE_DIR`` is set."""
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path(cache_dir) / "triton"))
    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen and not Path(chosen).resolve().name.startswith("torchinductor_"):
        return Path(chosen)
    target = Path(cache_dir) / "inductor"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(target)
    return target


@dataclass(frozen=True)
class Torchrun:
    """What torchrun tells each process it starts (its own variable names, not ``DIFFQ_*``),
    read once by :func:`torchrun`. Outside torchrun: rank 0 of a world of 1, no store."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: torchrun's key-value store; empty outside torchrun
    master_addr: str = ""
    master_port: int = 0
    #: torchrun's agent hosts the store (``TORCHELASTIC_USE_AGENT_STORE``): no rank is its master
    agent_store: bool = False
    #: ``--max-restarts`` round and run id: a restarted rank's keys are kept apart from the dead ones'
    restart_count: str = "0"
    run_id: str = "none"

    @property
    def has_store(self) -> bool:
        return bool(self.master_addr and self.master_port)


@cache
def torchrun() -> Torchrun:
    env = os.environ

    def number(name: str, default: int) -> int:
        raw = env.get(name, "")
        if not raw:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number (torchrun sets it)") from None

    return Torchrun(
        rank=number("RANK", 0),
        world_size=number("WORLD_SIZE", 1),
        local_rank=number("LOCAL_RANK", 0),
        master_addr=env.get("MASTER_ADDR", ""),
        master_port=number("MASTER_PORT", 0),
        agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        restart_count=env.get("TORCHELASTIC_RESTART_COUNT", "0"),
        run_id=env.get("TORCHELASTIC_RUN_ID", "none"),
    )


#: the passwords .env.example ships with, to be replaced (``change-me-redis``, ``change-me-dashboard``)
PLACEHOLDER_PREFIX = "change-me"


def is_placeholder(secret: str | None) -> bool:
    """Whether ``secret`` is one of .env.example's placeholders: a stack started with one is open
    to anyone who has read the repository, so workers, producer and dashboard refuse it."""
    return bool(secret) and secret.strip().lower().startswith(PLACEHOLDER_PREFIX)


def triton_interpreted() -> bool:
    """Whether Triton runs kernels on the CPU, program by program (``TRITON_INTERPRET=1``: the
    tests of the FP8 convolution); worker/pipelines/fp8_conv.py then autotunes nothing."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"
