"""compose.yaml, the Dockerfile and .env.example, checked without a container engine: parse
them, and run the very commands they run (interpolated from .env.example) against a real
redis-server started with the compose file's own Redis command. The rq-dashboard service's
command is started for real and its JSON endpoints are read."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_FLAGS, free_port, images_under, kill, wait_for, write_csv

from common.settings import ENV_NAMES, Settings

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
ENV_EXAMPLE = (ROOT / ".env.example").read_text()
#: the project's console scripts (producer, worker, rq-dashboard) live next to this Python
SCRIPTS_PATH = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::?([-?])([^}]*))?\}")


def dotenv(text: str) -> dict[str, str]:
    """The active NAME=value lines of an env file."""
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#") and "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error} (and $$ for a literal $)."""

    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == "?":
            raise AssertionError(f"compose would stop: {arg}")
        return arg if op == "-" else ""

    return VAR.sub(sub, value).replace("$$", "$")


def command(service: str, env: dict[str, str]) -> list[str]:
    spec = SERVICES[service]
    entry = spec.get("entrypoint") or []
    cmd = spec.get("command") or []
    cmd = shlex.split(cmd) if isinstance(cmd, str) else cmd
    return [interpolate(str(part), env) for part in [*entry, *cmd]]


def service_env(service: str, env: dict[str, str]) -> dict[str, str]:
    return {k: interpolate(str(v), env) for k, v in (SERVICES[service].get("environment") or {}).items()}


# -- static checks -----------------------------------------------------------------------------


def test_every_setting_is_in_env_example_with_its_default():
    defaults = Settings()
    # where compose.yaml gives a setting its own default (the group service's degrees), that one
    compose = {name: default for name, op, default in VAR.findall((ROOT / "compose.yaml").read_text()) if op == "-"}
    for setting, name in ENV_NAMES.items():
        default = getattr(defaults, setting)
        if setting == "cache_dir":
            default = "~/.cache/diffq"
        if isinstance(default, bool):
            default = int(default)
        shown = {str(default), compose.get(name, str(default))}
        assert any(re.search(rf"^#? ?{name}={re.escape(d)}$", ENV_EXAMPLE, re.M) for d in shown), name


def test_every_compose_variable_is_in_env_example():
    used = set(VAR.findall((ROOT / "compose.yaml").read_text() + (ROOT / "compose.cpu.yaml").read_text()))
    listed = set(re.findall(r"^#? ?([A-Z0-9_]+)=", ENV_EXAMPLE, re.M))
    assert {name for name, _, _ in used} <= listed


def test_redis_is_persistent_password_protected_and_health_checked():
    redis = SERVICES["redis"]
    cmd = " ".join(map(str, redis["command"]))
    assert "--appendonly yes" in cmd and "--appendfsync everysec" in cmd
    assert "--requirepass ${REDIS_PASSWORD:?" in cmd
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "ping" in " ".join(redis["healthcheck"]["test"])
    assert "ports" not in redis  # reachable from the services only


def test_dashboard_is_on_localhost_only_with_basic_auth():
    dash = SERVICES["dashboard"]
    assert dash["ports"] and all(str(p).startswith("127.0.0.1:") for p in dash["ports"])
    env = dash["environment"]
    assert env["RQ_DASHBOARD_USERNAME"].startswith("${") and env["RQ_DASHBOARD_PASSWORD"].startswith("${")
    assert ":?" in env["RQ_DASHBOARD_PASSWORD"]  # compose refuses to start without a password
    assert dash["command"][:2] == ["producer", "dashboard"]  # JSON workers, auth required, no delete


def test_workers_lease_gpus_and_stop_warm():
    worker = SERVICES["worker"]
    assert worker["command"][:4] == ["worker", "run", "--gpu-lease", "${DIFFQ_GPU_LEASE:-all}"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert "${DIFFQ_MACHINE_ID:-/etc/machine-id}:/etc/machine-id:ro" in worker["volumes"]
    assert worker["stop_grace_period"] == "5m"
    assert worker["restart"] == "unless-stopped"


def test_workers_and_dashboard_have_healthchecks_that_run_real_commands():
    worker, dash = SERVICES["worker"], SERVICES["dashboard"]
    assert worker["healthcheck"]["test"] == ["CMD", "worker", "health"]  # the heartbeat (tests/test_health.py)
    assert worker["healthcheck"]["start_period"]  # the first heartbeat follows the model's load
    probe = dash["healthcheck"]["test"]
    assert probe[:3] == ["CMD", "python3", "-c"] and "9181" in probe[3]
    compile(probe[3], "healthcheck", "exec")


def test_cpu_replicas_cap_their_threads_and_the_cpu_override_is_kept_by_compose_file():
    class Override(yaml.SafeLoader):
        """compose's own tags: ``!reset`` read as null, ``!override`` as the value it puts in place"""

    Override.add_constructor("!reset", lambda loader, node: None)
    Override.add_constructor("!override", lambda loader, node: loader.construct_mapping(node))
    cpu = yaml.load((ROOT / "compose.cpu.yaml").read_text(), Loader=Override)
    assert cpu["services"]["worker"]["environment"]["OMP_NUM_THREADS"] == "${DIFFQ_CPU_THREADS:-2}"
    # the replicas come from .env in both files, so a second `up` (a profile's) keeps them
    # (tests/compose/test_readme.py runs it); the CPU override drops only the GPU reservation
    assert cpu["services"]["worker"]["deploy"] == {"replicas": "${DIFFQ_WORKERS:-1}"}
    assert SERVICES["worker"]["deploy"]["replicas"] == "${DIFFQ_WORKERS:-1}"
    assert "# DIFFQ_WORKERS=1" in ENV_EXAMPLE
    assert "# COMPOSE_FILE=compose.yaml:compose.cpu.yaml" in ENV_EXAMPLE
    # the placeholders stay placeholders: diffq refuses them (tests/test_health.py, test_dashboard.py)
    assert re.search(r"^REDIS_PASSWORD=change-me", ENV_EXAMPLE, re.M)


def test_group_is_a_torchrun_service_on_its_own_gpus():
    group = SERVICES["group"]
    assert group["profiles"] == ["group"]  # not started by a plain `docker compose up`
    assert group["command"][:2] == ["torchrun", "--nproc-per-node"] and "--max-restarts" in group["command"]
    assert group["command"][group["command"].index("-m") + 1] == "worker.group"
    assert group["environment"]["CUDA_VISIBLE_DEVICES"] == "${DIFFQ_GROUP_GPUS:-4,5,6,7}"
    assert group["stop_grace_period"] == "5m" and group["restart"] == "unless-stopped"
    assert "group" in re.search(r'pip install .*"\.\[([a-z0-9,]+)\]"', (ROOT / "Dockerfile").read_text()).group(1)


def dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_is_pinned_non_root_and_keeps_secrets_out():
    steps = dockerfile()
    args = dict(arg.split("=", 1) for op, arg in steps if op == "ARG" and "=" in arg)
    base = next(arg for op, arg in steps if op == "FROM")
    base = args.get(base.strip("${}"), base)
    assert ":" in base and not base.endswith(":latest")
    assert re.fullmatch(r"[0-9.]+", args["TORCH_VERSION"])
    # no USER: the entrypoint starts as root to hand the data folder over, then drops to diffq
    assert not [arg for op, arg in steps if op == "USER" and arg in ("root", "0")]
    entry = json.loads(next(arg for op, arg in steps if op == "ENTRYPOINT"))
    assert entry == ["diffq-entrypoint"]
    script = (ROOT / "docker/entrypoint.sh").read_text()
    assert 'exec setpriv --reuid="$uid" --regid="$gid" --clear-groups' in script
    assert "uid=${DIFFQ_UID:-$(id -u diffq)}" in script  # the owner the user chose in .env, else diffq
    for op, arg in steps:
        if op == "RUN" and "pip install" in arg:
            assert "==" in arg or "-c docker/constraints.txt" in arg, arg
        assert "HF_TOKEN" not in arg or op not in ("ENV", "ARG"), "the token must come from the environment"
        if op == "COPY":
            for src in arg.split()[:-1]:
                assert (ROOT / src).exists(), f"COPY {src}: no such path"
    pins = [line for line in (ROOT / "docker/constraints.txt").read_text().splitlines() if line and line[0] != "#"]
    pin = r'[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*(; python(_full)?_version [<>]=? "3(\.[0-9]+)+")?'
    assert pins and all(re.fullmatch(pin, p) for p in pins)
    assert any(op == "VOLUME" and "/cache" in arg for op, arg in steps)


def test_the_image_can_compile_what_the_default_levers_compile():
    """On CUDA the default levers run torch.compile, whose Triton launcher is built at run time
    with a C compiler against the Python headers: the image must carry both."""
    apt = " ".join(arg for op, arg in dockerfile() if op == "RUN" and "apt-get install" in arg).split()
    assert {"gcc", "libc6-dev", "python3-dev"} <= set(apt)


def test_the_image_keeps_the_bytecode_pip_writes():
    """A worker's start is mostly imports: 20.3 s on a machine whose torch had no bytecode,
    9.4-11.5 s with it (H100, docs/benchmarks.md). pip writes it; nothing may turn that off."""
    steps = dockerfile()
    assert not [arg for op, arg in steps if op == "ENV" and re.search(r"PYTHONDONTWRITEBYTECODE|PIP_NO_COMPILE", arg)]
    assert not [arg for op, arg in steps if op == "RUN" and "pip install" in arg and "--no-compile" in arg]


@pytest.mark.slow
def test_dockerfile_cmd_is_a_real_command_with_valid_flags():
    cmd = json.loads(next(arg for op, arg in dockerfile() if op == "CMD"))
    env = {**os.environ, "PATH": SCRIPTS_PATH}
    result = subprocess.run([*cmd, "--help"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# -- the services' commands, run for real ------------------------------------------------------


@pytest.fixture
def stack(tmp_path: Path, cache_dir: Path):
    """The compose Redis command on a free port, plus the environment the services would see."""
    # .env as a user leaves it: the example with both placeholder passwords replaced
    values = dotenv(ENV_EXAMPLE) | {
        "DIFFQ_MODEL": "tiny",
        "REDIS_PASSWORD": "r3dis-pw",
        "RQ_DASHBOARD_PASSWORD": "d4sh-pw",
    }
    port = free_port()
    redis_cmd = command("redis", values)
    assert redis_cmd[0] == "redis-server"
    proc = subprocess.Popen(
        [*redis_cmd, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL
    )
    url = f"redis://:{values['REDIS_PASSWORD']}@127.0.0.1:{port}/0"
    import redis as redis_py

    conn = redis_py.Redis.from_url(url)
    wait_for(lambda: _pings(conn), 10, "the compose Redis command to answer")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"  # the container would see 2 GPUs; here a stand-in lists them
    smi.write_text("#!/bin/sh\necho 'GPU 0: stand-in (UUID: GPU-0)'\necho 'GPU 1: stand-in (UUID: GPU-1)'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {
        **os.environ,
        **values,
        "PATH": f"{bindir}:{SCRIPTS_PATH}",
        "DIFFQ_CACHE": str(cache_dir),
        "DIFFQ_LEASE_SCOPE": "compose-test",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DIFFQ_QUEUE", None)
    yield {"url": url, "conn": conn, "env": env, "values": values, "dir": tmp_path}
    proc.terminate()
    proc.wait(10)


def _pings(conn) -> bool:
    try:
        return bool(conn.ping())
    except Exception:
        return False


@pytest.mark.slow
def test_compose_redis_command_persists_and_requires_the_password(stack):
    import redis as redis_py

    assert (stack["dir"] / "appendonlydir").is_dir()
    with pytest.raises(redis_py.AuthenticationError):
        redis_py.Redis(port=stack["conn"].connection_pool.connection_kwargs["port"]).ping()


def get_json(url: str, auth: tuple[str, str] | None) -> object:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.long
def test_services_run_their_commands_and_the_dashboard_shows_the_queue(stack, tmp_path):
    env, values, url = stack["env"], stack["values"], stack["url"]
    out = tmp_path / "out"
    prompts = write_csv(tmp_path / "p.csv", "prompt,adapter\na lighthouse at dusk,\na broken one,/nonexistent/dora\n")

    # producer service: its entrypoint, with `enqueue` as `docker compose run producer enqueue` would
    producer_env = {**env, **service_env("producer", values)}
    assert producer_env["REDIS_URL"].endswith("@redis:6379/0")
    producer_env["REDIS_URL"] = url  # the service name `redis` resolves only inside compose
    base = command("producer", values)[:1]
    # the producer container does not see the workers' adapter mounts: --no-path-checks
    enqueue = [*base, "enqueue", str(prompts), *TINY_FLAGS, "--output", str(out), "--no-path-checks"]
    done = subprocess.run(enqueue, env=producer_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    # worker service: its command, in burst mode
    worker_env = {**env, **service_env("worker", values), "REDIS_URL": url}
    worker = subprocess.run(
        [*command("worker", values), "--burst"], env=worker_env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "leased GPU 0 of host compose-test" in worker.stderr
    assert len(images_under(out)) == 1
    # the adapter is missing on that worker: given back; a second replica missing it too fails it
    again = subprocess.run(
        [*command("worker", values), "--burst"], env=worker_env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert again.returncode == 0, again.stderr[-3000:]

    # the producer service's default command: status
    status = subprocess.run(
        command("producer", values), env=producer_env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0 and "finished  1" in status.stdout and "failed    1" in status.stdout

    # a live worker for the dashboard to list (named after its leased GPU)
    live = subprocess.Popen(command("worker", values), env=worker_env, cwd=ROOT, stderr=subprocess.PIPE)
    dash_env = {**env, **service_env("dashboard", values)}
    dash_env["REDIS_URL"] = url
    port = free_port()
    dash_cmd = command("dashboard", values)
    dash_cmd[dash_cmd.index("--port") + 1] = str(port)
    dash_cmd[dash_cmd.index("--bind") + 1] = "127.0.0.1"
    dash = subprocess.Popen(dash_cmd, env=dash_env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        auth = (values["RQ_DASHBOARD_USERNAME"], values["RQ_DASHBOARD_PASSWORD"])
        root = f"http://127.0.0.1:{port}/0/data"
        wait_for(lambda: _answers(f"{root}/queues.json"), 600, "rq-dashboard to answer")
        with pytest.raises(urllib.error.HTTPError) as denied:
            get_json(f"{root}/queues.json", None)
        assert denied.value.code == 401

        queues = {q["name"]: q for q in get_json(f"{root}/queues.json", auth)["queues"]}
        assert queues["diffq"]["count"] == 0
        assert queues["diffq"]["failed_job_registry_count"] == 1
        assert queues["diffq"]["finished_job_registry_count"] == 1

        def workers() -> list[dict]:
            return get_json(f"{root}/workers.json", auth)["workers"]

        listed = wait_for(lambda: [w for w in workers() if w["name"].startswith("diffq-gpu")], 600, "the live worker")
        assert listed[0]["name"].startswith("diffq-gpu0-") and listed[0]["queues"] == ["diffq"]

        failed = get_json(f"{root}/jobs/diffq/failed/10/asc/1.json", auth)["jobs"]
        assert len(failed) == 1
        job = failed[0]
        reason = job["exc_info"].splitlines()[0]  # the one-line reason comes first
        assert "/nonexistent/dora" in reason and "Traceback" not in reason
        assert job["description"].startswith("'a broken one' · 1 img · 64x64")
        info = get_json(f"{root}/job/{job['id']}.json", auth)
        meta = json.loads(info["metadata"])
        assert "/nonexistent/dora" in meta["error"] and "\n" not in meta["error"]

        finished = get_json(f"{root}/jobs/diffq/finished/10/asc/1.json", auth)["jobs"]
        assert len(finished) == 1
        assert finished[0]["description"].startswith("'a lighthouse at dusk' · 1 img · 64x64 · 3 steps")
    finally:
        for proc in (dash, live):
            proc.send_signal(signal.SIGTERM)
        for proc in (dash, live):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                kill(proc)


@pytest.mark.slow
@pytest.mark.long
def test_group_service_command_runs_a_group(stack, tmp_path):
    """The group service's exact command (2 ranks, the tiny model, data parallel on the CPU)."""
    env, values, url = stack["env"], stack["values"], stack["url"]
    out = tmp_path / "out"
    prompts = write_csv(tmp_path / "p.csv", "prompt\na lighthouse at dusk\ntwo cats on a roof\n")
    producer_env = {**env, **service_env("producer", values), "REDIS_URL": url}
    enqueue = [*command("producer", values)[:1], "enqueue", str(prompts), *TINY_FLAGS, "--queue", "flux"]
    done = subprocess.run([*enqueue, "--output", str(out)], env=producer_env, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    overrides = {"DIFFQ_GROUP_SIZE": "2", "DIFFQ_GROUP_MODEL": "tiny", "DIFFQ_ULYSSES_DEGREE": "1",
                 "DIFFQ_DATA_PARALLEL_DEGREE": "2", "DIFFQ_GROUP_DTYPE": "auto"}  # fmt: skip
    group_env = {**env, **service_env("group", values | overrides), "REDIS_URL": url}
    assert group_env.pop("CUDA_VISIBLE_DEVICES") == "4,5,6,7"  # no GPUs here
    cmd = command("group", values | overrides)
    cmd[cmd.index("--nproc-per-node") :] = ["--standalone", *cmd[cmd.index("--nproc-per-node") :]]
    run = subprocess.run(
        [*cmd, "--burst", "--device", "cpu"], env=group_env, cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "data-parallel 2 = 2 ranks" in run.stderr
    assert len(images_under(out)) == 2


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError:
        return True  # 401 without credentials: it is up
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        time.sleep(0.2)
        return False
    return True


def test_the_image_installs_what_s3_outputs_need_at_the_pinned_versions():
    extras = re.search(r'pip install .*"\.\[([a-z0-9,]+)\]"', (ROOT / "Dockerfile").read_text()).group(1)
    assert "s3" in extras.split(",")
    pins = (ROOT / "docker" / "constraints.txt").read_text()
    assert "\ns3fs==" in pins and "\naiobotocore==" in pins and "\nbotocore==" in pins


# -- the Slurm script's own checks, with stand-ins for srun and squeue (tests/slurm runs it on Slurm)


def sbatch_script(tmp_path: Path, limit: str, path_extra: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in {"srun": 'echo "srun $*"', "squeue": f"echo '{limit}'"}.items():
        (bindir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / name).chmod(0o755)
    (tmp_path / "worker").mkdir(exist_ok=True)  # the repo's folder of that name, in the submission directory
    base = {"PATH": f"{bindir}:{path_extra}/usr/bin:/bin", "REDIS_URL": "redis://localhost:6379/0", "SLURM_JOB_ID": "7"}
    return subprocess.run(
        ["bash", str(ROOT / "deploy" / "slurm" / "diffq-workers.sbatch")],
        cwd=tmp_path,
        env={**base, **env, "SLURM_JOB_NODELIST": "node1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sbatch_without_the_venv_says_to_activate_it_instead_of_running_the_repos_folder(tmp_path):
    done = sbatch_script(tmp_path, "1-00:00:00")
    assert done.returncode == 2 and "srun" not in done.stdout
    assert "'worker' is not a command here: activate the venv" in done.stderr


def test_sbatch_runs_the_worker_by_its_absolute_path_and_warns_of_a_short_time_limit(tmp_path):
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "worker").write_text("#!/bin/sh\n")
    (venv / "worker").chmod(0o755)
    long = sbatch_script(tmp_path, "1-00:00:00", path_extra=f"{venv}:")
    assert long.returncode == 0 and f"{venv}/worker launch --gpus all" in long.stdout
    assert "warning" not in long.stderr
    short = sbatch_script(tmp_path, "5:00", path_extra=f"{venv}:")
    assert short.returncode == 0 and "time limit is 300 s" in short.stderr and "--signal=TERM@<seconds>" in short.stderr


@pytest.mark.parametrize(
    ("compose", "v1", "code", "says"),
    [
        ("v2.40.3", "", 0, "found Docker Compose 2.40.3: ok"),
        ("v2.20.2", "", 1, "found Docker Compose 2.20.2: diffq's compose.cpu.yaml needs v2.24.0 or newer"),
        ("", "1.29.2", 1, "found docker-compose 1.29.2 (Compose v1) but no 'docker compose'"),
        ("", "", 1, "found no 'docker compose'"),
    ],
)
def test_the_compose_check_says_what_it_found(tmp_path, compose, v1, code, says):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker_body = f'[ "$1 $2" = "compose version" ] && [ -n "{compose}" ] && echo "{compose}" && exit 0; exit 1'
    (bindir / "docker").write_text(f"#!/bin/sh\n{docker_body}\n")
    if v1:
        (bindir / "docker-compose").write_text(f"#!/bin/sh\necho {v1}\n")
    for tool in bindir.iterdir():
        tool.chmod(0o755)
    done = subprocess.run(
        ["sh", str(ROOT / "deploy" / "check-compose.sh")],
        env={"PATH": f"{bindir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == code and says in done.stdout, done.stdout
