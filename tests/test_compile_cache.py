"""Compile once per fleet: with ``--compile-cache redis`` a host that has never compiled loads
torch's compiled graphs from the queue's Redis instead of compiling them again. Two processes,
each with an empty compile folder of its own (two hosts), on a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from conftest import ROOT

from common.errors import ConfigError
from common.settings import Settings

#: one "host": a worker's pipeline cache set up as the worker does, then a small module compiled
HOST = """
import json, sys, torch
from torch._dynamo.utils import counters
from common.settings import Settings
from worker.pipelines.warm import WarmPipelines

settings = Settings.load(cache_dir=sys.argv[1], compile_cache=sys.argv[2])
WarmPipelines(settings.cache_dir, "cpu", "float32", "none", compile_cache=settings.compile_cache_url())
module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
with torch.inference_mode():
    torch.compile(module, fullgraph=True, dynamic=False)(torch.randn(8, 16))
print(json.dumps({**counters["inductor"], **counters["aot_autograd"]}))
"""


def host(tmp_path: Path, name: str, redis_url: str, compile_cache: str) -> dict[str, int]:
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", HOST, str(tmp_path / name), compile_cache],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_compile_cache_setting_names_the_redis_or_refuses_in_one_line(redis_url):
    assert Settings.load(redis_url=redis_url).compile_cache_url() is None
    assert Settings.load(redis_url=redis_url, compile_cache="redis").compile_cache_url() == redis_url
    other = "rediss://:secret@cache.example:6380/2"
    assert Settings.load(redis_url=redis_url, compile_cache=other).compile_cache_url() == other
    with pytest.raises(ConfigError, match=r"--compile-cache 'http://x': use local, redis"):
        Settings.load(compile_cache="http://x")


@pytest.mark.slow  # two processes that import torch and compile (about 30 s on 2 cores)
@pytest.mark.long
def test_a_new_host_loads_what_another_compiled_from_the_queues_redis(tmp_path, redis_url):
    conn = redis.Redis.from_url(redis_url)
    alone = host(tmp_path, "alone", redis_url, "local")
    assert alone.get("fxgraph_cache_miss") == 1 and not conn.keys("pt2:*")  # local: nothing shared

    first = host(tmp_path, "first", redis_url, "redis")
    assert first.get("fxgraph_cache_miss") == 1 and first.get("autograd_cache_saved") == 1
    assert conn.keys("pt2:fx-graph*") and conn.keys("pt2:autograd*")

    second = host(tmp_path, "second", redis_url, "redis")  # an empty folder of its own
    assert second.get("fxgraph_cache_hit") == 1 and second.get("autograd_cache_hit") == 1, second
    assert not second.get("fxgraph_cache_miss")
