"""The ``worker`` command: run one worker here, launch one per GPU, or prepare the tiny model."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import click
import redis

from common.errors import ConfigError, DiffqError
from common.presets import OFFLOAD_MODES, PRECISIONS, SPEEDUP_LEVERS, auto_help
from common.queues import PATIENCE_FOREVER, WARM_STOP_REDIS_S, WAY_OUT, connect, get_queue
from common.settings import Settings, redact


def _fail(exc: DiffqError) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(exc.exit_code)


def _log_format(label: str) -> str:
    return f"%(asctime)s gpu={label} %(levelname)s %(message)s"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """Run diffq workers: warm diffusion pipelines that drain a Redis queue."""


def run_options(func: Any) -> Any:
    options = [
        click.option("--queue", help="Queue to serve [env DIFFQ_QUEUE; default diffq]."),
        click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL]."),
        click.option("--dtype", help="auto (fp16 on CUDA, fp32 on CPU), float32, float16, bfloat16 [auto]."),
        click.option("--cache-dir", help="Where presets are written [env DIFFQ_CACHE; ~/.cache/diffq]."),
        click.option(
            "--speedups",
            help=f"auto, none, or a list of {', '.join(SPEEDUP_LEVERS)}; auto in a list adds the defaults "
            f"[DIFFQ_SPEEDUPS; auto on CUDA: {auto_help()}; none for other pipelines and on the CPU].",
        ),
        click.option(
            "--precision",
            type=click.Choice(list(PRECISIONS)),
            help="fp16 (the weights' dtype) or fp8: the UNet's wide linears in FP8 with static scales calibrated once "
            "per model and host (Ada/Hopper GPUs; elsewhere one line and fp16) [DIFFQ_PRECISION; fp16].",
        ),
        click.option(
            "--compile-cache",
            help="local, redis (share compiled graphs through the queue's Redis: a new host of the fleet "
            "loads them instead of compiling) or a redis:// URL [DIFFQ_COMPILE_CACHE; default local].",
        ),
        click.option(
            "--offload",
            type=click.Choice(list(OFFLOAD_MODES)),
            metavar="MODE",
            help="Where the weights live: none (on the GPU), model or sequential (on the CPU, moved in as needed; "
            "for 8-16 GB GPUs), auto (measured: none where the pipeline and a batch fit) [DIFFQ_OFFLOAD; auto].",
        ),
        click.option(
            "--gpu-memory",
            type=float,
            help="GiB of the GPU this worker may use; batches and --offload auto are sized to it "
            "[DIFFQ_GPU_MEMORY; default all that is free].",
        ),
        click.option("--preload", help="Load this model before taking the first job (e.g. tiny, sdxl-random)."),
        click.option(
            "--max-models",
            type=click.IntRange(min=1),
            help="Models kept warm at once, for campaigns of several models whose weights fit the GPU together "
            "(SDXL and FLUX on an H200: 2); jobs of a held model are taken first [default 1].",
        ),
        click.option(
            "--metrics-port",
            type=int,
            help="Serve Prometheus metrics (images, jobs, job time, failures, pauses) on this port; launch gives "
            "each worker the next one [DIFFQ_METRICS_PORT; 0: off].",
        ),
        click.option(
            "--keep-finished",
            type=click.IntRange(min=0),
            help="Finished jobs kept for rq-dashboard; older ones are deleted (the ledger keeps the counts) "
            "[10000; 0: RQ's result TTL].",
        ),
        click.option(
            "--overlap-save/--no-overlap-save",
            default=None,
            help="Write a job's images on a thread while the next job denoises [on].",
        ),
        click.option(
            "--precompile/--no-precompile",
            default=None,
            help="Keep the compiled UNet and decoder as files a restarted worker loads [on].",
        ),
        click.option("--burst", is_flag=True, help="Exit when the queue is empty."),
        click.option("--max-jobs", type=int, help="Exit after this many jobs."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@main.command()
@run_options
@click.option("--device", help="auto, cpu or cuda [env DIFFQ_DEVICE; default auto].")
@click.option("--name", help="Worker name shown in rq-dashboard [default diffq-gpu<N>-<host>-<pid>].")
@click.option(
    "--gpu-lease",
    help="Take one free GPU of these (all, or 0,1,2,3) by a lease in Redis; for compose --scale [DIFFQ_GPU_LEASE].",
)
@click.option("--lifeline", type=int, hidden=True, help="(worker launch) fd that closes when the launcher dies.")
def run(**opts: Any) -> None:
    """Run one worker in this process (no fork per job; the pipeline stays warm)."""
    if opts["lifeline"] is not None:
        watch_lifeline(opts["lifeline"])
    try:
        settings = Settings.load(
            queue=opts["queue"],
            redis_url=opts["redis_url"],
            device=opts["device"],
            dtype=opts["dtype"],
            cache_dir=opts["cache_dir"],
            speedups=opts["speedups"],
            precision=opts["precision"],
            gpu_lease=opts["gpu_lease"],
            compile_cache=opts["compile_cache"],
            offload=opts["offload"],
            gpu_memory=opts["gpu_memory"],
            metrics_port=opts["metrics_port"],
            keep_finished=opts["keep_finished"],
            overlap_save=opts["overlap_save"],
            precompile=opts["precompile"],
        )
        lease = None
        # until RQ installs its handlers, SIGTERM or Ctrl-C must still unwind (and release the
        # lease), and end even with Redis down: the lease's renewal is retrying meanwhile
        from worker.supervision.launch import STOP_SIGNALS  # no torch there: it runs before the GPU is pinned

        for signum in STOP_SIGNALS:
            signal.signal(signum, _exit_while_starting)
        _quiet_libraries()
        logging.basicConfig(level=settings.log_level, format=_log_format(settings.gpu_label))
        logging.getLogger("diffq.worker").info("starting: importing torch and diffusers (seconds, on a cold disk)")
        if settings.gpu_lease:
            settings, lease = _lease_gpu(settings)
        try:
            _run(settings, opts, lease)
        finally:
            if lease is not None:
                _release(lease)
    except DiffqError as exc:
        _fail(exc)


def _exit_while_starting(signum: int, _frame: FrameType | None) -> None:
    WAY_OUT.give_up_after(WARM_STOP_REDIS_S)
    sys.exit(128 + signum)


def _release(lease: Any) -> None:
    try:
        lease.release()
    except redis.RedisError as exc:
        logging.getLogger("diffq.worker").warning(
            "GPU lease %s: Redis did not answer (%s); the lease lapses by itself", lease.index, exc.__class__.__name__
        )


def _quiet_libraries() -> None:
    """One line per event: botocore says "Found credentials in environment variables." for every
    S3 client it makes (half of an S3 run's log)."""
    logging.getLogger("botocore.credentials").setLevel(logging.WARNING)


#: what to do when the launcher is gone: exit, until the worker can give its job back first
_on_orphaned: list[Any] = [lambda: os._exit(1)]


def watch_lifeline(fd: int) -> None:
    """``worker launch`` keeps the write end of this pipe; when the read ends, it is gone."""

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 64):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        _on_orphaned[-1]()

    threading.Thread(target=watch, name="diffq-lifeline", daemon=True).start()


def _lease_gpu(settings: Settings) -> tuple[Settings, Any]:
    """Lease a GPU and pin this process to it, before anything imports torch. A CPU worker
    (``--device cpu``, compose.cpu.yaml) leases a slot by the same index and is named and logged
    ``cpu<N>``, not ``gpu<N>``."""
    from worker.supervision.lease import GpuLease, candidates, lease_scope

    logging.basicConfig(level=settings.log_level, format=_log_format("lease"), force=True)
    conn = connect(settings.redis_url, retries=PATIENCE_FOREVER)
    cpu = settings.device == "cpu"
    scope = lease_scope(settings.lease_scope)
    lease = GpuLease(conn, scope, candidates(settings.gpu_lease), kind="CPU slot" if cpu else "GPU")
    index = lease.acquire()
    os.environ["CUDA_VISIBLE_DEVICES"] = index
    return settings.with_(gpu_label=f"cpu{index}" if cpu else index), lease


def _run(settings: Settings, opts: dict[str, Any], lease: Any = None) -> None:
    # torch and diffusers are imported here, after the launcher has set CUDA_VISIBLE_DEVICES
    from worker.pipelines.warm import WarmPipelines
    from worker.serving.rqworker import DiffqWorker
    from worker.serving.runtime import Runtime, worker_name
    from worker.serving.signals import EXIT_LEASE_LOST

    pipelines = WarmPipelines.from_settings(settings, max_models=opts["max_models"] or 1)
    if settings.gpu_label == "-":
        settings = settings.with_(gpu_label="cpu" if pipelines.device.type == "cpu" else "all")
    # force: a leasing worker configured logging before it knew its GPU (label "lease")
    logging.basicConfig(level=settings.log_level, format=_log_format(settings.gpu_label), force=True)
    log = logging.getLogger("diffq.worker")
    conn = connect(settings.redis_url, retries=PATIENCE_FOREVER)
    name = opts["name"] or worker_name(settings.gpu_label)
    metrics = None
    if settings.metrics_port:
        from worker.serving.metrics import WorkerMetrics

        metrics = WorkerMetrics(name, settings.gpu_label, settings.queue)
        try:
            metrics.serve(settings.metrics_port)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {settings.metrics_port}: cannot listen ({exc.strerror})") from None
    rt = Runtime(settings, pipelines, worker_name=name, metrics=metrics)
    worker = DiffqWorker(
        [get_queue(settings.queue, conn)],
        connection=conn,
        name=name,
        lease=lease,
        runtime=rt,
        heartbeat_ttl=settings.heartbeat_ttl,
    )
    _on_orphaned.append(lambda: worker.stops.cold("its launcher is gone"))
    if opts["preload"]:  # before it says it serves: compose's logs show a replica ready only once it is
        pipelines.get(opts["preload"])
    log.info(
        "worker %s serving queue %r at %s on %s (%s, speedups %s, offload %s)",
        name,
        settings.queue,
        redact(settings.redis_url),
        pipelines.device,
        str(pipelines.dtype).removeprefix("torch."),
        pipelines.speedups.per_kind(),
        pipelines.offload,
    )
    worker.work(
        burst=opts["burst"],
        max_jobs=opts["max_jobs"],
        logging_level=settings.log_level,
        log_format=_log_format(settings.gpu_label),
        with_scheduler=False,  # the keeper thread moves due retries; no child process to orphan
    )
    worker.stops.wait_for_cold_exit()
    if worker.lease_lost:
        sys.exit(EXIT_LEASE_LOST)


@main.command()
@click.option("--gpus", default="all", show_default=True, help="GPU indices (0,1,2,3), all, or cpu,cpu for CPU.")
@run_options
def launch(gpus: str, **opts: Any) -> None:
    """Start one pinned `worker run` per GPU, prefix their logs, restart crashed ones.

    Ctrl-C / SIGTERM / SIGHUP: every worker finishes its current job and exits; a second one stops now.
    """
    from worker.supervision.launch import Launcher, parse_gpus

    try:
        slots = parse_gpus(gpus, Settings.visible_devices())
        Settings.load(
            queue=opts["queue"],
            redis_url=opts["redis_url"],
            dtype=opts["dtype"],
            speedups=opts["speedups"],
            precision=opts["precision"],
            compile_cache=opts["compile_cache"],
            offload=opts["offload"],
            gpu_memory=opts["gpu_memory"],
        )
    except DiffqError as exc:
        _fail(exc)
    run_args: list[str] = []
    names = (
        "queue",
        "redis_url",
        "dtype",
        "cache_dir",
        "speedups",
        "precision",
        "compile_cache",
        "offload",
        "gpu_memory",
        "keep_finished",
    )
    for name in (*names, "preload", "max_models", "max_jobs"):
        if opts[name] is not None:
            run_args += [f"--{name.replace('_', '-')}", str(opts[name])]
    for name in ("overlap_save", "precompile"):  # the switches: --name or --no-name
        if opts[name] is not None:
            run_args.append(f"--{'' if opts[name] else 'no-'}{name.replace('_', '-')}")
    if opts["burst"]:
        run_args.append("--burst")
    sys.exit(Launcher(slots, run_args, burst=opts["burst"]).run())


@main.command()
@click.option("--redis-url", help="redis://... [env REDIS_URL].")
def health(redis_url: str | None) -> None:
    """Exit 0 if a worker on this host has a fresh heartbeat in Redis, else 1 with one line
    (compose's healthcheck: the heartbeat, not the process, says whether the worker is alive)."""
    from redis import RedisError

    from worker.supervision.health import live_workers_here, this_host

    try:
        settings = Settings.load(redis_url=redis_url)
        conn = connect(settings.redis_url, retries=2)
        names = live_workers_here(conn, this_host(), ttl=settings.heartbeat_ttl)
    except (DiffqError, RedisError) as exc:
        click.echo(f"worker health: {exc}", err=True)
        sys.exit(1)
    if not names:
        ttl = settings.heartbeat_ttl
        click.echo(f"worker health: no worker on {this_host()} has renewed its heartbeat in {ttl}s", err=True)
        sys.exit(1)
    click.echo(f"worker health: {', '.join(names)} alive")


@main.command("prepare-tiny")
@click.option("--cache-dir", help="Cache folder [env DIFFQ_CACHE; ~/.cache/diffq].")
def prepare_tiny(cache_dir: str | None) -> None:
    """Write the tiny model and the tiny-dora adapter to the cache (done on first use anyway)."""
    from worker.pipelines.models import ensure_tiny, ensure_tiny_dora

    settings = Settings.load(cache_dir=cache_dir)
    click.echo(f"tiny model:   {ensure_tiny(settings.cache_dir)}")
    click.echo(f"tiny-dora:    {ensure_tiny_dora(settings.cache_dir)}")
