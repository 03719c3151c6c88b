"""Compile once per fleet: torch's remote caches on Redis.

A worker compiles the UNet and the VAE decoder once per host (about two minutes on an H100) and
keeps the result in its cache folder, so a restarted worker skips most of it. A *new* host
starts with an empty folder. Inductor can also keep its compiled graphs (the FX-graph cache,
kernels bundled) and AOTAutograd's in a Redis, keyed by the graph, the torch version and the
GPU; with ``--compile-cache redis`` every worker of the fleet reads and fills the queue's Redis,
so only the first host of a kind compiles. The entries have no TTL (they are content-addressed
and few: one per graph, a few MB each); ``redis-cli --scan --pattern 'pt2:*'`` lists them.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

from common.settings import redact

log = logging.getLogger("diffq.worker")


def share_compile_cache(url: str | None) -> None:
    """Turn on torch's remote FX-graph, AOTAutograd and autotuning caches at ``url``; None: off.

    Set on the config objects (not only through ``TORCHINDUCTOR_*_REMOTE_CACHE``, which torch
    reads once, when its config module is first imported). Inductor's Redis backend reads its
    address from the environment when it first connects: ``TORCHINDUCTOR_REDIS_URL`` (a
    password, TLS and the database come with it), and host and port for torch releases that
    only know those."""
    if not url:
        return
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    parts = urlsplit(url)
    os.environ["TORCHINDUCTOR_REDIS_URL"] = url
    if parts.hostname:
        os.environ["TORCHINDUCTOR_REDIS_HOST"] = parts.hostname
        os.environ["TORCHINDUCTOR_REDIS_PORT"] = str(parts.port or 6379)
    inductor_config.fx_graph_remote_cache = True
    inductor_config.autotune_remote_cache = True
    functorch_config.enable_remote_autograd_cache = True
    log.info("compile cache: shared through the Redis at %s (torch's remote caches)", redact(url))


class FleetRedis:
    """The Redis a fleet shares what one host measured or compiled (``--compile-cache redis``):
    connected on first use; when it does not answer, ``what`` is said once in the log and this
    host goes on by itself (every call answers None from then on)."""

    def __init__(self, url: str | None, what: str) -> None:
        self.url = url
        self.what = what
        self._client: Any = None

    def call(self, method: str, *args: Any) -> Any:
        if not self.url:
            return None
        import redis

        try:
            if self._client is None:
                self._client = redis.Redis.from_url(self.url, socket_timeout=30)
            return getattr(self._client, method)(*args)
        except redis.RedisError as exc:
            log.warning(
                "%s: the shared Redis at %s did not answer (%s); this host goes on alone",
                self.what,
                redact(self.url),
                exc,
            )
            self.url = None
            return None
