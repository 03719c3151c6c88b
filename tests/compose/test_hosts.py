"""Two hosts on one Redis, the way a team outgrows one machine: two compose projects, each
with its own ``/etc/machine-id`` file and ``--scale worker=2``, the second running workers only
and reaching the first's Redis; every worker writes to one S3 bucket (moto's server, on the
host, listening on the projects' network). Leases are per host (indices 0 and 1 on each), and
every image is written once with one metadata line.

Simulated: both "hosts" are projects on one machine's Docker engine, CPU only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from conftest import ROOT, S3Server, free_port, s3_objects, wait_for
from test_stack import REDIS_PASSWORD, Stack, docker, serving

BUCKET = "two-hosts"


class Host(Stack):
    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "-p", self.project, "--env-file", str(self.env_file)]
        cmd += ["-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / "compose.cpu.yaml")]
        cmd += ["-f", str(ROOT / "tests" / "compose" / "shared-network.yaml"), *args]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, Host, S3Server]]:
    home = tmp_path_factory.mktemp("hosts")
    network = f"diffq-hosts-{os.getpid()}"
    docker("network", "create", network)
    gateway = docker("network", "inspect", "-f", "{{(index .IPAM.Config 0).Gateway}}", network).strip()
    s3 = S3Server(free_port(), host=gateway)
    s3.start()
    s3.client().create_bucket(Bucket=BUCKET)
    made: list[Host] = []
    try:
        for name in ("a", "b"):
            (home / f"machine-id-{name}").write_text(f"{name * 32}\n")
            env_file = home / f"{name}.env"
            settings = {
                "REDIS_PASSWORD": REDIS_PASSWORD,
                "RQ_DASHBOARD_PASSWORD": "two-hosts",
                "DIFFQ_DATA": home / f"data-{name}",
                "DIFFQ_MODEL": "tiny",
                "DIFFQ_ENV_FILE": env_file,
                "DIFFQ_DASHBOARD_PORT": free_port(),
                "DIFFQ_MACHINE_ID": home / f"machine-id-{name}",
                "DIFFQ_TORCH_INDEX_URL": "",
                "DIFFQ_TEST_NETWORK": network,
                **s3.env(),
            }
            env_file.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
            made.append(Host(f"diffq-host-{name}-{os.getpid()}", env_file, home / f"data-{name}"))
        first, second = made
        first.compose("up", "-d", "--scale", "worker=2", timeout=900)
        second.compose("up", "-d", "--no-deps", "--scale", "worker=2", "worker", timeout=900)
        yield first, second, s3
    finally:
        for host in made:
            host.compose("down", "-v", "--timeout", "30", check=False)
        subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)
        s3.stop()
        shutil.rmtree(home, ignore_errors=True)


def test_two_hosts_lease_their_own_gpus_and_write_every_image_once_to_one_bucket(hosts):
    first, second, s3 = hosts
    for host in (first, second):
        wait_for(lambda h=host: serving(h, 2), 600, f"{host.project}'s workers to serve", interval=2)
    leases = first.redis("--scan", "--pattern", "diffq:gpu-lease:*").split()
    scopes: dict[str, list[str]] = {}
    for key in leases:
        scope, index = key.split(":")[2:4]
        scopes.setdefault(scope, []).append(index)
    assert sorted(map(sorted, scopes.values())) == [["0", "1"], ["0", "1"]], leases

    first.data.mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples" / "prompts.csv", first.data / "prompts.csv")
    first.producer("enqueue", "/data/prompts.csv", "--output", f"s3://{BUCKET}/run", "--model", "tiny",
                   "--width", "64", "--height", "64", "--steps", "4", "--chunk-size", "2")  # fmt: skip
    first.producer("wait", "--stall-timeout", "300", timeout=1800)

    objects = s3_objects(s3, BUCKET, "run/")
    images = sorted(key.removeprefix("run/") for key in objects if key.endswith(".png"))
    lines = [json.loads(line) for key, body in objects.items() if key.endswith(".jsonl")
             for line in body.decode().splitlines()]  # fmt: skip
    assert len(images) == 13
    assert sorted(line["file_name"] for line in lines) == images  # one line per image, none twice
    finished = json.loads(first.producer("status", "--json").stdout)
    assert finished["jobs"]["failed"] == 0 and finished["images"]["written"] == 13
