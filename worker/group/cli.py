"""``python -m worker.group``: one rank of an xDiT group, started by torchrun.

    torchrun --nproc-per-node 4 -m worker.group --model flux-random --queue flux --ulysses-degree 4

Start-up, in order: check the degrees against the world size (before any GPU or network work),
join the process group, rank 0 checks Redis, every rank loads the model, all wait until all
have loaded (a separate, long timeout: loads differ), the model is split, then rank 0 serves
the queue and the others follow. Exit status: 0 done or stopped, 2 bad settings, 4 the group
lost a rank (its job was re-queued; torchrun ``--max-restarts`` or compose restarts the group).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from datetime import timedelta
from typing import Any, NoReturn

import click

from common.errors import DiffqError
from common.settings import Settings, redact, torchrun
from worker.group.config import DEFAULT_TIMEOUT_S, GroupLayout

#: the key rank 0 sets in torchrun's store once it has printed a start-up mistake
SAID_KEY = "diffq/start-up-error-said"
#: how long the other ranks wait for that before they exit anyway
SAID_WAIT_S = 60
#: how long ranks wait for each other to finish loading the model (a cold hub download is slow)
LOAD_TIMEOUT_S = 1800

log = logging.getLogger("diffq.group")


def _rank() -> tuple[int, int]:
    run = torchrun()
    return run.rank, run.world_size


def _fail(exc: DiffqError, rank: int) -> None:
    """Every rank finds the same mistake and one line is enough: rank 0 says it. The others wait
    until it has (a key in torchrun's own store, at most :data:`SAID_WAIT_S`): torchrun stops the
    remaining ranks as soon as one exits, and would stop a rank 0 still importing before it spoke."""
    store = _launcher_store()
    if rank == 0:
        click.echo(f"error: {exc}", err=True)
        if store is not None:
            try:
                store.set(SAID_KEY, "1")
            except (RuntimeError, OSError) as why:  # the other ranks wait SAID_WAIT_S, then exit
                log.warning("could not tell the other ranks the error was said: %s", why)
    elif store is not None:
        try:
            store.wait([SAID_KEY], timedelta(seconds=SAID_WAIT_S))
        except (RuntimeError, OSError) as why:  # rank 0 did not say it in time: exit all the same
            log.debug("rank %d: rank 0 did not report the error in %ss: %s", rank, SAID_WAIT_S, why)
    sys.exit(exc.exit_code)


def _launcher_store() -> Any:
    """torchrun's key-value store (``MASTER_ADDR:MASTER_PORT``), or None outside torchrun."""
    run = torchrun()
    if not run.has_store:
        return None
    try:
        from torch.distributed import TCPStore

        return TCPStore(run.master_addr, run.master_port, is_master=False, timeout=timedelta(seconds=SAID_WAIT_S))
    except (RuntimeError, OSError) as why:  # the error is said all the same, by every rank
        log.debug("torchrun's store at %s:%s did not answer: %s", run.master_addr, run.master_port, why)
        return None


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--model", help="Model every rank loads: hub id, folder, or preset (flux-random, sdxl-random, tiny).")
@click.option("--queue", help="Queue to serve [env DIFFQ_QUEUE; default diffq].")
@click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL].")
@click.option(
    "--ulysses-degree",
    "--ulysses_degree",
    type=int,
    help="Ulysses sequence parallel (DiT) [1].",
)
@click.option("--ring-degree", "--ring_degree", type=int, help="Ring sequence parallel (DiT) [1].")
@click.option(
    "--pipefusion-degree",
    "--pipefusion-parallel-degree",
    "--pipefusion_parallel_degree",
    type=int,
    help="PipeFusion patch pipeline (DiT) [1].",
)
@click.option(
    "--cfg-parallel",
    "--use_cfg_parallel",
    is_flag=True,
    default=None,
    help="Split the CFG pass over 2 ranks (SDXL).",
)
@click.option(
    "--data-parallel-degree",
    "--data_parallel_degree",
    type=int,
    help="Groups of ranks that each make part of a batch [1].",
)
@click.option(
    "--parallel-vae",
    "--use_parallel_vae",
    is_flag=True,
    default=None,
    help="Every rank decodes a slice of each image (DiT; xDiT's DistVAE), for 2048² and up.",
)
@click.option(
    "--group-jobs-only",
    is_flag=True,
    default=None,
    help="Take only the queue's group lane (jobs for groups), not the shared queue.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=int,
    help=f"Seconds a rank waits for the others, then exits [{DEFAULT_TIMEOUT_S}].",
)
@click.option("--dtype", help="auto (fp16 on CUDA; bf16 for flux-random), float32, float16, bfloat16.")
@click.option("--device", help="auto (each rank's GPU, else CPU with gloo) or cpu [env DIFFQ_DEVICE].")
@click.option("--cache-dir", help="Where presets are written [env DIFFQ_CACHE; ~/.cache/diffq].")
@click.option("--name", help="Worker name in rq-dashboard [default diffq-group-<gpus>-<host>-<pid>].")
@click.option("--burst", is_flag=True, help="Exit when the queue is empty.")
@click.option("--max-jobs", type=int, help="Exit after this many jobs.")
def main(**opts: Any) -> None:
    """One rank of an xDiT worker group (start N of them with torchrun)."""
    rank, world = _rank()
    try:
        settings = Settings.load(
            queue=opts["queue"],
            redis_url=opts["redis_url"],
            dtype=opts["dtype"],
            cache_dir=opts["cache_dir"],
            device=opts["device"],
            group_jobs_only=opts["group_jobs_only"],
        )
        layout = GroupLayout.load(
            ulysses_degree=opts["ulysses_degree"],
            ring_degree=opts["ring_degree"],
            pipefusion_degree=opts["pipefusion_degree"],
            cfg_parallel=opts["cfg_parallel"],
            data_parallel_degree=opts["data_parallel_degree"],
            parallel_vae=opts["parallel_vae"],
            timeout_s=opts["timeout_s"],
        )
        layout.check_world(world)
    except DiffqError as exc:
        _fail(exc, rank)
    model = opts["model"] or settings.model
    sys.exit(_serve(settings, layout, model, opts, rank, world))


def _serve(settings: Settings, layout: GroupLayout, model: str, opts: dict[str, Any], rank: int, world: int) -> int:
    gpus = ",".join(Settings.visible_devices() or [])
    logging.basicConfig(
        level=settings.log_level, format=f"%(asctime)s group rank={rank}/{world} %(levelname)s %(message)s"
    )
    # until rank 0's RQ worker installs its handlers, a signal only asks for a stop after loading
    stop_early: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop_early.append(signum))
    conn = None
    try:
        if rank == 0:
            from common.queues import PATIENCE_FOREVER, connect

            conn = connect(settings.redis_url, retries=PATIENCE_FOREVER)

        import torch

        from worker.group.comm import Control, init_world, local_rank, publish_pid
        from worker.group.engine import RankEngine

        cuda = settings.device != "cpu" and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank())
        init_world("nccl" if cuda else "gloo", layout.timeout_s)
        publish_pid()
        control = Control(layout.timeout_s)
        engine = RankEngine(settings, layout, rank, world)
        if rank == 0:
            log.info("xDiT group of %d rank(s): %s; model %s", world, layout.describe(), model)
        started = time.perf_counter()
        log.info("rank %d (pid %d): loading model %s", rank, os.getpid(), model)
        engine.load(model)
        _wait_all_loaded(rank, world)
        engine.split()
        if rank == 0:
            log.info("group ready in %.1fs", time.perf_counter() - started)
    except DiffqError as exc:
        _fail(exc, rank)
        return exc.exit_code
    if rank != 0:
        from worker.group.follower import Follower

        follower = Follower(engine, control)
        follower.stop_asked = bool(stop_early)
        signal.signal(signal.SIGTERM, follower.on_signal)
        signal.signal(signal.SIGINT, follower.on_signal)
        return _finish(follower.serve(), engine)
    return _finish(_lead(settings, engine, control, conn, opts, gpus, world, bool(stop_early)), engine)


def _lead(
    settings: Settings,
    engine: Any,
    control: Any,
    conn: Any,
    opts: dict[str, Any],
    gpus: str,
    world: int,
    stop_early: bool,
) -> int:
    from common.lanes import MADE_BY_GROUP, LaneQueue, group_lane
    from common.queues import get_queue
    from worker.group.leader import GroupPipelines, GroupWorker
    from worker.serving.runtime import Runtime

    group = GroupPipelines(engine, control)
    host = socket.gethostname().split(".")[0]
    label = f"gpu{gpus.replace(',', '+')}" if gpus else f"{engine.pipelines.device.type}x{world}"
    name = opts["name"] or f"diffq-group-{label}-{host}-{os.getpid()}"
    from worker.group.comm import local_peers

    # the group lane first, at every job boundary; then the campaign's own queue (common/lanes.py)
    lanes = [group_lane(settings.queue)] + ([] if settings.group_jobs_only else [settings.queue])
    queues = [get_queue(lane, conn, queue_class=LaneQueue) for lane in lanes]
    rt = Runtime(settings, group, worker_name=name, made_by=MADE_BY_GROUP)
    worker = GroupWorker(
        queues,
        queue_class=LaneQueue,
        connection=conn,
        name=name,
        group=group,
        peers=local_peers(),
        runtime=rt,
        heartbeat_ttl=settings.heartbeat_ttl,
    )
    log.info(
        "worker %s serving queue %r (its group lane %r first) at %s",
        name, settings.queue, group_lane(settings.queue), redact(settings.redis_url),
    )  # fmt: skip
    code = 0
    try:
        if stop_early:
            log.info("stop asked during start-up; exiting")
        else:
            worker.work(
                burst=opts["burst"],
                max_jobs=opts["max_jobs"],
                logging_level=settings.log_level,
                log_format=f"%(asctime)s group rank=0/{world} %(levelname)s %(message)s",
                with_scheduler=False,
            )
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    group.stop(code)
    return code


def _wait_all_loaded(rank: int, world: int) -> None:
    """Ranks load at different speeds; wait on torchrun's store, not on a collective whose
    timeout is the (short) group timeout."""
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    key = "loaded"  # under this run's and restart's prefix (see comm.init_world)
    store.add(key, 1)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    said = 0.0
    while (done := store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            raise SystemExit(f"rank {rank}: only {done} of {world} ranks loaded the model in {LOAD_TIMEOUT_S}s")
        if rank == 0 and time.monotonic() - said > 30:
            said = time.monotonic()
            log.info("waiting for ranks to load the model: %d of %d ready", done, world)
        time.sleep(0.2)


def _finish(code: int, engine: Any) -> NoReturn:
    """Leave the process group, then the process: whole on a clean stop; on a lost group (a
    peer gone) without NCCL's teardown, which may wait on the peer. CUDA graphs that captured
    NCCL's collectives are dropped first (:func:`worker.pipelines.step_graphs.release`); with a
    peer gone not even a CUDA sync or a graph's release is sure to return, so such a rank skips
    them (its job was given back).

    Every rank then ends with ``os._exit`` once its logs are flushed, never through the
    interpreter's finalization: a collective's worker thread (gloo's run loop, NCCL's watchdog)
    lets go of the collective's tensors on its own time, and a functional collective (a FLUX
    split's all-to-all, the ring's gather) leaves that last reference to the thread alone. A
    tensor let go while the interpreter finalizes takes the GIL from a dying interpreter, which
    cancels the thread inside a C++ destructor: the process aborts (``terminate called without
    an active exception``, SIGABRT) after a clean stop. Seen once in CI in a FLUX Ulysses group
    on gloo; two gloo ranks of functional all-to-alls (``bench/exit_abort.py``) aborted so in 7
    of 40 exits after ``destroy_process_group``, under gdb in
    ``AsyncAlltoallWork::~AsyncAlltoallWork`` → ``decref_pyobject`` → ``take_gil`` →
    ``pthread_exit``; with ``os._exit`` after it, in 0 of 40. What the interpreter would still
    do at exit is done by then: the RQ worker's teardown drained the writer and told Redis."""
    import torch
    import torch.distributed as dist

    from worker.pipelines import step_graphs

    held = engine.graphs_hold_collectives
    if held and code == 0:
        torch.cuda.synchronize()
        step_graphs.release(engine.loaded.pipe)
    if dist.is_initialized() and code == 0:
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
