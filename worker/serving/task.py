"""The RQ job function: turn one chunk spec into images on disk, recorded exactly once.

``perform`` reads as its steps: validate → plan (skip what is done, keep what an interrupted
attempt wrote) → check space → get the warm pipeline and adapter → run the batch → write the
files → record. It is idempotent: every output name comes from the content hash, and the
record step is fenced (see :mod:`common.ledger`): a worker that lost its job while it was
stalled writes no metadata line, counts nothing and returns no result.

The last two steps are the job's *tail*. On a diffq worker with overlap on, the tail runs on
the worker's writer thread while the next job denoises (see :mod:`worker.serving.overlap`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import redis
from PIL import Image
from rq import get_current_job
from rq.job import Job

from common.errors import (
    AdapterNotFound,
    ModelLoadError,
    NeedsAGroup,
    OutOfMemory,
    OutputNotWritable,
    OutputRefused,
)
from common.jobspec import JobSpec, PromptItem
from common.lanes import MADE_BY_WORKER, campaign_of, group_lane
from common.ledger import Ledger, is_done
from common.naming import image_relpath, item_key
from common.queues import items_key, load_failures_key, queued_jobs, scores_key, seen_key, seen_member
from common.reconcile import live_workers
from common.storage import is_url
from worker.output.destination import Destination, open_destination
from worker.pipelines.backend import Batch
from worker.pipelines.pixels import BatchResult
from worker.pipelines.scores import Scorers
from worker.serving import context
from worker.serving.context import JobContext
from worker.serving.failures import refused_here

log = logging.getLogger("diffq.worker")

META_SAVE_INTERVAL_S = 0.5
#: a job's phases, timed in its result (and per image in its metadata lines)
PHASES = ("load_s", "adapter_s", "encode_s", "denoise_s", "decode_s", "save_s")


class JobLost(Exception):
    """This worker's execution of the job is no longer the current one (its heartbeat expired
    while it was stalled, and the job went back to the queue): it must record nothing."""


class JobStopped(Exception):
    """RQ's ``stop-job`` command asked for this job: it ends ``stopped`` between two denoising
    steps, before any of its images is written."""


class _Progress:
    """Writes step and image progress into ``job.meta`` (what rq-dashboard and status show)."""

    def __init__(self, job: Job | None, images: int) -> None:
        self.job = job
        self.last_save = 0.0
        if job is not None:
            job.meta.pop("error", None)  # a reason left by an earlier attempt no longer holds
            job.meta.update(images=images, images_done=0, step=0, steps=None)

    def update(self, force: bool = False, **fields: Any) -> None:
        if self.job is None:
            return
        self.job.meta.update(fields)
        now = time.monotonic()
        if force or now - self.last_save >= META_SAVE_INTERVAL_S:
            self.last_save = now
            self.job.save_meta()


@dataclass
class Plan:
    """What a job still has to do, after looking at the ledger and the disk."""

    keys: list[str]
    todo: list[tuple[str, PromptItem, int]] = field(default_factory=list)  # (key, item, image index)
    existing: list[tuple[str, PromptItem, int]] = field(default_factory=list)  # written by an earlier attempt
    skipped: int = 0  # images of items already done


def _item_record(spec: JobSpec, item: PromptItem, key: str, index: int) -> dict[str, Any]:
    p = spec.params
    return {
        "file_name": image_relpath(key, index, p.file_format.extension),  # what Hugging Face imagefolder reads
        "key": key,
        "index": index,
        "num_images": item.num_images,  # with the rest, what rebuilds the item's key (producer verify)
        "id": item.id,
        "prompt": item.prompt,
        "negative_prompt": item.negative_prompt,
        "seed": item.seed + index,
        **p.record(),  # every generation parameter (common/jobspec.py:GenParams)
    }


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The function RQ calls: the job's code gets the worker's context as its first argument."""
    return perform(context.current(), spec)


@dataclass
class Run:
    """One execution of one job: what every step after validation works on."""

    ctx: JobContext
    job: Job | None
    chunk: JobSpec
    output: Destination
    plan: Plan
    progress: _Progress
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    #: each image's reward scores, in the order of ``plan.todo`` (empty: none asked)
    scores: list[dict[str, float]] = field(default_factory=list)

    @property
    def conn(self) -> redis.Redis | None:
        return self.job.connection if self.job is not None else None

    @property
    def lane(self) -> str:
        """The RQ queue the job came from: the campaign's own or its group lane."""
        return self.job.origin if self.job is not None else self.ctx.runtime.settings.queue

    @property
    def queue_name(self) -> str:
        """The campaign: the ledger's name, whichever lane the job came from."""
        return campaign_of(self.lane)


def perform(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    rt = ctx.runtime
    job = get_current_job()

    # 1. Validate the payload (it came from Redis, so it is untrusted) and count the attempt
    chunk = JobSpec.from_dict(spec)
    try:
        output = open_destination(chunk.output, rt.settings)
    except OutputRefused as exc:  # this job's folder alone: other workers may write it
        refused = OutputNotWritable(str(exc).replace(" on this worker", ""))
        raise refused_here(job, rt.worker_name, f"output {chunk.output!r}", refused, exc) from None
    _count_attempt(job)

    # 2. Plan: skip what is done, keep images an interrupted attempt finished
    queue_name = campaign_of(job.origin if job is not None else rt.settings.queue)
    if job is not None and not is_url(chunk.output):  # a folder deleted whole later is known as deleted here
        job.connection.sadd(seen_key(queue_name), seen_member(chunk.output))
    plan = _plan(job.connection if job is not None else None, queue_name, chunk, output)
    run = Run(ctx, job, chunk, output, plan, _Progress(job, images=chunk.num_images), started=started)
    batch = BatchResult([], 0.0, 0.0, 0.0)
    if plan.todo:
        # 3. Room for the images, before any GPU time is spent on them
        output.make_room(
            [image_relpath(key, i, chunk.params.file_format.extension) for key, _, i in plan.todo],
            chunk.params.width * chunk.params.height * 3,
        )
        # 4. Generate
        batch = _generate(run)
        if batch.precision:  # status shows it beside the job's progress
            run.progress.update(precision=batch.precision)
    # 5. and 6. on the writer thread while the next job denoises, where the worker has one
    tail = partial(_tail, run, batch)
    if plan.todo and ctx.hand_off is not None and job is not None:
        return ctx.hand_off(tail)
    return tail()


def _tail(run: Run, batch: BatchResult) -> dict[str, Any]:
    """5. write each image under its content-derived name, 6. record: metadata lines, items
    done, counters, fenced on the job's execution. Returns the job's RQ result."""
    plan, chunk, job = run.plan, run.chunk, run.job
    records: list[dict[str, Any]] = []
    if plan.todo:
        run.scores = batch.scores
        records = _save(run, batch.images)
        run.progress.update(images_done=plan.skipped + len(plan.existing) + len(records))
    existing = [_item_record(chunk, item, key, i) | {"recovered": True} for key, item, i in plan.existing]
    counted = _record(run, records + existing)
    _count_scores(run, records[:counted])
    timings = run.timings
    timings["total_s"] = time.perf_counter() - run.started
    if run.ctx.runtime.metrics is not None:
        run.ctx.runtime.metrics.job_finished(images=len(records), seconds=timings["total_s"])
    run.progress.update(force=True, images_done=chunk.num_images)
    conn = run.conn
    left = queued_jobs(conn, run.queue_name) if conn is not None else 0
    per_image = timings["total_s"] / len(records) if records else 0.0
    log.info(
        "job %s: %d image(s) in %.1fs (%.2f s/img)%s%s; %d job(s) queued",
        job.id if job else "-",
        len(records),
        timings["total_s"],
        per_image,
        f", {plan.skipped} done before" if plan.skipped else "",
        f", {len(plan.existing)} recovered" if plan.existing else "",
        left,
    )
    return {
        "files": [r["file_name"] for r in records],
        "skipped": plan.skipped,
        "recovered": len(plan.existing),
        "counted": counted,  # images this execution added to the queue's counter
        "output": run.output.location,
        "timings": {k: round(v, 4) for k, v in timings.items()},
        "worker": run.ctx.runtime.worker_name,
        "written_at": time.time(),  # with overlap, after the next job has started
        "compiles": batch.compiles,  # graphs torch.compile built in this job (0 once warm)
        **({"batch": batch.batch, "offload": batch.offload} if batch.batch else {}),  # GPU batch, weights' place
        **({"gpu_peak_gib": round(batch.peak_bytes / 2**30, 2)} if batch.peak_bytes else {}),
        **({"precision": batch.precision} if batch.precision else {}),  # fp8, fp16, bf16 or fp32
    }


def _job_id() -> str:
    job = get_current_job()
    return job.id if job is not None else "-"


def _count_attempt(job: Job | None) -> int:
    """The attempt this is (``job.meta["attempts"]``, shown by status and rq-dashboard)."""
    if job is None:
        return 1
    attempt = job.meta["attempts"] = int(job.meta.get("attempts", 0)) + 1
    job.save_meta()
    return attempt


def _plan(conn: redis.Redis | None, queue_name: str, chunk: JobSpec, output: Destination) -> Plan:
    keys = [item_key(chunk.params, item) for item in chunk.items]
    states = conn.hmget(items_key(queue_name), keys) if conn is not None else [None] * len(keys)
    ext = chunk.params.file_format.extension
    rels = [
        image_relpath(key, i, ext) for key, item in zip(keys, chunk.items, strict=True) for i in range(item.num_images)
    ]
    there = output.existing(rels)
    plan = Plan(keys=keys)
    for key, item, state in zip(keys, chunk.items, states, strict=True):
        mine = [image_relpath(key, i, ext) for i in range(item.num_images)]
        if is_done(state) and all(rel in there for rel in mine):
            plan.skipped += item.num_images
            continue
        for index, rel in enumerate(mine):
            (plan.existing if rel in there else plan.todo).append((key, item, index))
    return plan


def _to_a_group_if_served(run: Run, why: str) -> None:
    """A job too big for a single-GPU worker goes to the group lane when a group serves the
    campaign (:class:`~common.errors.NeedsAGroup`); without one it runs here (offloaded) or
    fails as it would have."""
    rt, job = run.ctx.runtime, run.job
    if job is None or rt.made_by != MADE_BY_WORKER:
        return
    lane = group_lane(run.queue_name)
    if live_workers(job.connection, lane, rt.settings.heartbeat_ttl):
        raise NeedsAGroup(f"{why}; handed to the group lane {lane!r}, where a group serves it")


def _generate(run: Run) -> BatchResult:
    """The warm pipeline (loaded once per worker), this chunk's adapter, one batch."""
    ctx, plan, progress, timings = run.ctx, run.plan, run.progress, run.timings
    rt = ctx.runtime
    params = run.chunk.params
    model = f"model {params.model!r}"
    rt.breaker.check(model)
    try:
        loaded, timings["load_s"] = rt.pipelines.get(params.model, on_progress=lambda text: progress.update(
            force=True, loading=text))  # fmt: skip
    except ModelLoadError as exc:
        rt.breaker.failed(model, str(exc))
        _said_load(run, params.model, str(exc))
        raise refused_here(get_current_job(), rt.worker_name, model, exc) from None
    rt.breaker.succeeded(model)
    if timings["load_s"]:
        _said_load(run, params.model, None)
    if rt.settings.offload == "auto" and getattr(loaded, "offload", "none") != "none":
        _to_a_group_if_served(run, f"{params.model} does not fit this GPU without offloading ({loaded.offload})")
    started = time.perf_counter()  # an adapter's first job loads it, a switch merges it: both show here
    stack = params.stack()
    adapters = [f"adapter {name!r}" for name, _ in stack]
    for adapter in adapters:
        rt.breaker.check(adapter)
    try:
        rt.pipelines.use_adapters(loaded, stack)
    except (AdapterNotFound, ModelLoadError) as exc:
        # the adapter that failed is named in the message; each of the stack's is counted against
        failed = [a for a in adapters if a.removeprefix("adapter ") in str(exc)] or adapters
        for adapter in failed:
            rt.breaker.failed(adapter, str(exc))
        raise refused_here(get_current_job(), rt.worker_name, failed[0], exc) from None
    for adapter in adapters:
        rt.breaker.succeeded(adapter)
    _use_decoder(run, loaded)
    timings["adapter_s"] = time.perf_counter() - started

    shape = (params.model, params.width, params.height)
    # at most what fitted so far; else a full chunk, so that a tail chunk is padded up to the
    # graph compiled for full ones rather than compiled again at its own size
    limit = rt.batch_limits.get(shape, max(len(plan.todo), rt.settings.chunk_size))
    batch = Batch(
        params,
        prompts=[item.prompt for _, item, _ in plan.todo],
        negatives=[item.negative_prompt for _, item, _ in plan.todo],
        seeds=[item.seed + index for _, item, index in plan.todo],
        max_batch=limit,
    )
    try:
        result, fitted = rt.pipelines.generate(
            loaded,
            batch,
            on_step=lambda step, steps: _on_step(ctx, progress, step, steps),
            on_progress=lambda text: progress.update(force=True, loading=text),
        )
    except OutOfMemory as exc:
        _to_a_group_if_served(run, str(exc))
        raise
    if fitted < len(plan.todo):
        rt.batch_limits[shape] = fitted
        progress.update(force=True, split_batch=fitted)
    timings.update(encode_s=result.encode_s, denoise_s=result.denoise_s, decode_s=result.decode_s)
    if run.chunk.scores and result.images:
        started = time.perf_counter()
        result.scores = _scores(run, result.images, batch.prompts)
        timings["score_s"] = time.perf_counter() - started
    if result.compiles:
        log.info(
            "job %s: torch.compile built %d graph(s) (first job of a shape or adapter)", _job_id(), result.compiles
        )
    return result


def _use_decoder(run: Run, loaded: Any) -> None:
    """The job's preview decoder (``--decoder``), loaded as a model is: one this worker cannot
    load gives the job back for other workers, and the breaker counts it."""
    rt, name = run.ctx.runtime, run.chunk.params.decoder
    what = f"decoder {name!r}"
    if name is not None:
        rt.breaker.check(what)
    try:
        rt.pipelines.use_decoder(loaded, name)
    except ModelLoadError as exc:
        rt.breaker.failed(what, str(exc))
        _said_load(run, what, str(exc))
        raise refused_here(get_current_job(), rt.worker_name, what, exc) from None
    if name is not None:
        rt.breaker.succeeded(what)


def _scores(run: Run, images: list[Image.Image], prompts: list[str]) -> list[dict[str, float]]:
    """The batch's reward scores, on this worker's device; a scorer that will not load is left
    out and said in ``producer status`` as a model that did not load, the images still made."""
    rt = run.ctx.runtime
    if rt.scorers is None:
        rt.scorers = Scorers(getattr(rt.pipelines, "device", "cpu"), rt.settings.cache_dir)
    return rt.scorers.score(
        run.chunk.scores, images, prompts, on_broken=lambda spec, why: _said_load(run, f"scorer {spec}", why)
    )


def _count_scores(run: Run, records: list[dict[str, Any]]) -> None:
    """Add the recorded images' scores to the campaign's sums (best effort: what status shows
    of them trails the lines, never leads them)."""
    conn = run.conn
    scored = [r["scores"] for r in records if r.get("scores")]
    if conn is None or not scored:
        return
    try:
        with conn.pipeline(transaction=False) as pipe:
            for scores in scored:
                for name, value in scores.items():
                    pipe.hincrbyfloat(scores_key(run.queue_name), f"{name}:n", 1)
                    pipe.hincrbyfloat(scores_key(run.queue_name), f"{name}:sum", value)
                    pipe.hincrbyfloat(scores_key(run.queue_name), f"{name}:sumsq", value * value)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not count this job's scores for producer status: %s", exc)


def _said_load(run: Run, model: str, reason: str | None) -> None:
    """Keep ``model``'s failed load for ``producer status`` (None: it loaded, forget the last
    failure). Best effort: Redis being away must not turn a load into a failed job."""
    conn = run.conn
    if conn is None:
        return
    key = load_failures_key(run.queue_name)
    try:
        if reason is None:
            conn.hdel(key, model)
        else:
            said = {"worker": run.ctx.runtime.worker_name, "reason": reason, "at": time.time()}
            conn.hset(key, model, json.dumps(said))
    except redis.RedisError as exc:
        log.warning("could not record model %s's load for producer status: %s", model, exc)


def _on_step(ctx: JobContext, progress: _Progress, step: int, steps: int) -> None:
    progress.update(step=step, steps=steps)
    ctx.between_steps()  # the previous job's tail may be done: the worker completes it in RQ


def _save(run: Run, images: list[Image.Image]) -> list[dict[str, Any]]:
    """Write each image whole (a folder: temp file and rename; a bucket: one PUT each)."""
    started = time.perf_counter()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    records = [_item_record(run.chunk, item, key, index) | {"created": created} for key, item, index in run.plan.todo]
    for record, scores in zip(records, run.scores, strict=False):
        if scores:  # in the PNG and the line, beside the parameters
            record["scores"] = scores
    run.output.write_images(records, images)
    run.timings["save_s"] = time.perf_counter() - started
    per_image = {k: round(v / len(records), 4) for k, v in run.timings.items()}
    for record in records:
        record["timings"] = per_image | {"batch": len(records)}
    return records


def _record(run: Run, records: list[dict[str, Any]]) -> int:
    """Write the metadata lines and mark the items done, as one step (under the metadata lock
    on a folder), only while this execution still owns the job. Returns the images newly counted.

    Lines are skipped for items already recorded, and for items an earlier execution was about
    to record (its intent offset) when the destination already has them from that offset on."""
    job, execution, plan = run.job, run.ctx.execution, run.plan
    conn = run.conn
    with run.output.journal(job.id if job is not None else "direct", execution) as journal:
        if conn is None or job is None or execution is None:  # a plain RQ worker or a direct call: no fence
            journal.write(records)
            return len(records)
        ledger = Ledger(conn, run.lane)
        begun = ledger.begin(member=execution, offset=journal.offset, keys=plan.keys)
        if begun is None:
            raise JobLost(f"job {job.id}: this worker lost it while stalled; recorded nothing")
        by_key: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            by_key.setdefault(record["key"], []).append(record)
        lines: list[dict[str, Any]] = []
        for key, found in zip(plan.keys, begun, strict=True):
            mine = by_key.get(key, [])
            if found.recorded or not mine:
                continue
            if found.intent is not None:
                there = journal.already_there(found.intent, {r["file_name"] for r in mine})
                mine = [r for r in mine if r["file_name"] not in there]
            lines += mine
        journal.write(lines)
        counted = ledger.commit(
            member=execution,
            images={key: item.num_images for key, item in zip(plan.keys, run.chunk.items, strict=True)},
            recent_member=f"{job.id}:{len(records)}:{time.perf_counter() - run.started:.3f}",
            output=run.chunk.output,
            model=run.chunk.params.model,
            made_by=run.ctx.runtime.made_by,
        )
        if counted is None:
            raise JobLost(f"job {job.id}: this worker lost it while recording; {journal.withdraw()}")
    return counted
