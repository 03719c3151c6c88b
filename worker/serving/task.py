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

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import redis
from PIL import Image
from rq import get_current_job
from rq.job import Job

from common.errors import AdapterNotFound, ModelLoadError, OutputNotWritable, OutputRefused
from common.jobspec import JobSpec, PromptItem
from common.ledger import DONE, Ledger
from common.naming import image_relpath, item_key, metadata_part
from common.queues import RECENT_WINDOW_S, get_queue, images_key, intents_key, items_key, recent_key
from common.settings import Settings
from common.storage import Store, is_url
from worker.faults import block_in_c, fail_early_attempts, hold_writer, install_oom_fault
from worker.output.images import (
    ENVIRONMENT_ERRNOS,
    check_space,
    drop_temp_dir,
    locked_metadata,
    png_bytes,
    prepare_output,
    remove_stale_temps,
    temp_dir,
    unavailable,
    write_atomic,
)
from worker.output.objects import drop_part, existing, part_bytes, prepare_store, put_all
from worker.pipelines.generate import BatchResult
from worker.serving import context
from worker.serving.context import JobContext
from worker.serving.failures import refused_here
from worker.serving.runtime import Runtime

log = logging.getLogger("diffq.worker")

META_SAVE_INTERVAL_S = 0.5
#: worst case bytes of one PNG (random noise barely compresses) plus its metadata line
PNG_OVERHEAD = 8192


class JobLost(Exception):
    """This worker's execution of the job is no longer the current one (its heartbeat expired
    while it was stalled, and the job went back to the queue): it must record nothing."""


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
        "file_name": image_relpath(key, index),  # what Hugging Face imagefolder reads
        "key": key,
        "index": index,
        "num_images": item.num_images,  # with the rest, what rebuilds the item's key (producer verify)
        "id": item.id,
        "prompt": item.prompt,
        "negative_prompt": item.negative_prompt,
        "seed": item.seed + index,
        "model": p.model,
        "adapter": p.adapter,
        "adapter_scale": p.adapter_scale if p.adapter else None,
        "width": p.width,
        "height": p.height,
        "steps": p.steps,
        "guidance": p.guidance,
    }


def run_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The function RQ calls: the job's code gets the worker's context as its first argument."""
    return perform(context.current(), spec)


def perform(ctx: JobContext, spec: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    rt = ctx.runtime
    job = get_current_job()
    conn: redis.Redis | None = job.connection if job is not None else None
    queue_name = job.origin if job is not None else rt.settings.queue

    # 1. Validate the payload (it came from Redis, so it is untrusted) and count the attempt
    chunk = JobSpec.from_dict(spec)
    try:
        output = _destination(chunk.output, rt.settings)
    except OutputRefused as exc:  # this job's folder alone: other workers may write it
        refused = OutputNotWritable(str(exc).replace(" on this worker", ""))
        raise refused_here(job, rt.worker_name, f"output {chunk.output!r}", refused, exc) from None
    _count_attempt(job, rt.settings.fault_fail_attempts)

    # 2. Plan: skip what is done, keep images an interrupted attempt finished
    plan = _plan(conn, queue_name, chunk, output)
    progress = _Progress(job, images=chunk.num_images)
    timings = {"load_s": 0.0, "encode_s": 0.0, "denoise_s": 0.0, "decode_s": 0.0, "save_s": 0.0}
    batch = BatchResult([], 0.0, 0.0, 0.0)
    if plan.todo:
        # 3. Room for the images, before any GPU time is spent on them (a bucket has no "full")
        if isinstance(output, Path):
            check_space(output, len(plan.todo) * (chunk.params.width * chunk.params.height * 3 + PNG_OVERHEAD))
        # 4. Generate
        batch = _generate(ctx, chunk, plan, progress, timings)
    # 5. and 6. on the writer thread while the next job denoises, where the worker has one
    tail = partial(_tail, rt, job, ctx.execution, queue_name, chunk, output, plan, batch, progress, timings, started)
    if plan.todo and ctx.hand_off is not None and job is not None:
        return ctx.hand_off(tail)
    return tail()


def _tail(
    rt: Runtime,
    job: Job | None,
    execution: str | None,
    queue_name: str,
    chunk: JobSpec,
    output: Path | Store,
    plan: Plan,
    batch: BatchResult,
    progress: _Progress,
    timings: dict[str, float],
    started: float,
) -> dict[str, Any]:
    """5. write each image under its content-derived name, 6. record: metadata lines, items
    done, counters, fenced on ``execution``. Returns the job's RQ result."""
    conn: redis.Redis | None = job.connection if job is not None else None
    records: list[dict[str, Any]] = []
    if plan.todo:
        hold_writer(rt.settings.fault_hold_writer)
        records = _save(chunk, plan, batch.images, output, timings)
        progress.update(images_done=plan.skipped + len(plan.existing) + len(records))
    existing = [_item_record(chunk, item, key, i) | {"recovered": True} for key, item, i in plan.existing]
    counted = _record(conn, queue_name, job, execution, chunk, plan, output, records + existing, started)
    timings["total_s"] = time.perf_counter() - started
    progress.update(force=True, images_done=chunk.num_images)
    left = conn.llen(get_queue(queue_name, conn).key) if conn is not None else 0
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
        "output": chunk.output if isinstance(output, Store) else str(output),
        "timings": {k: round(v, 4) for k, v in timings.items()},
        "worker": rt.worker_name,
        "written_at": time.time(),  # with overlap, after the next job has started
        "compiles": batch.compiles,  # graphs torch.compile built in this job (0 once warm)
        **({"fp16_redo": batch.fp16_redo} if batch.fp16_redo else {}),  # FP8 was not finite for these
    }


def _job_id() -> str:
    job = get_current_job()
    return job.id if job is not None else "-"


def _destination(location: str, settings: Settings) -> Path | Store:
    """A local folder (created now) or an object-store prefix."""
    if is_url(location):
        return prepare_store(location, settings.output_root, settings.s3_endpoint_url)
    return prepare_output(location, settings.output_root)


def _count_attempt(job: Job | None, fail_attempts: int) -> None:
    attempt = 1
    if job is not None:
        attempt = job.meta["attempts"] = int(job.meta.get("attempts", 0)) + 1
        job.save_meta()
    fail_early_attempts(attempt, fail_attempts)


def _plan(conn: redis.Redis | None, queue_name: str, chunk: JobSpec, output: Path | Store) -> Plan:
    keys = [item_key(chunk.params, item) for item in chunk.items]
    states = conn.hmget(items_key(queue_name), keys) if conn is not None else [None] * len(keys)
    rels = [image_relpath(key, i) for key, item in zip(keys, chunk.items, strict=True) for i in range(item.num_images)]
    there = existing(output, rels) if isinstance(output, Store) else {r for r in rels if (output / r).exists()}
    plan = Plan(keys=keys)
    for key, item, state in zip(keys, chunk.items, states, strict=True):
        mine = [image_relpath(key, i) for i in range(item.num_images)]
        if state == DONE.encode() and all(rel in there for rel in mine):
            plan.skipped += item.num_images
            continue
        for index, rel in enumerate(mine):
            if rel in there:
                plan.existing.append((key, item, index))
            else:
                if isinstance(output, Path):
                    remove_stale_temps(output / rel, temp_dir(output))
                plan.todo.append((key, item, index))
    return plan


def _generate(
    ctx: JobContext, chunk: JobSpec, plan: Plan, progress: _Progress, timings: dict[str, float]
) -> BatchResult:
    """The warm pipeline (loaded once per worker), this chunk's adapter, one batch."""
    rt = ctx.runtime
    params = chunk.params
    model = f"model {params.model!r}"
    rt.breaker.check(model)
    try:
        loaded, timings["load_s"] = rt.pipelines.get(params.model, on_progress=lambda text: progress.update(
            force=True, loading=text))  # fmt: skip
    except ModelLoadError as exc:
        rt.breaker.failed(model, str(exc))
        raise refused_here(get_current_job(), rt.worker_name, model, exc) from None
    rt.breaker.succeeded(model)
    if params.adapter:
        adapter = f"adapter {params.adapter!r}"
        rt.breaker.check(adapter)
        try:
            rt.pipelines.use_adapter(loaded, params.adapter, params.adapter_scale)
        except (AdapterNotFound, ModelLoadError) as exc:
            rt.breaker.failed(adapter, str(exc))
            raise refused_here(get_current_job(), rt.worker_name, adapter, exc) from None
        rt.breaker.succeeded(adapter)
    else:
        rt.pipelines.use_adapter(loaded, None, params.adapter_scale)

    if rt.settings.fault_oom_above >= 0:
        install_oom_fault(loaded.pipe, rt.settings.fault_oom_above)
    block_in_c(rt.settings.fault_block_decode)
    shape = (params.model, params.width, params.height)
    limit = rt.batch_limits.get(shape, len(plan.todo))
    result, fitted = rt.pipelines.generate(
        loaded,
        params,
        prompts=[item.prompt for _, item, _ in plan.todo],
        negatives=[item.negative_prompt for _, item, _ in plan.todo],
        seeds=[item.seed + index for _, item, index in plan.todo],
        max_batch=limit,
        on_step=lambda step, steps: _on_step(ctx, progress, step, steps),
        on_progress=lambda text: progress.update(force=True, loading=text),
    )
    if fitted < len(plan.todo):
        rt.batch_limits[shape] = fitted
        progress.update(force=True, split_batch=fitted)
    timings.update(encode_s=result.encode_s, denoise_s=result.denoise_s, decode_s=result.decode_s)
    if result.compiles:
        log.info(
            "job %s: torch.compile built %d graph(s) (first job of a shape or adapter)", _job_id(), result.compiles
        )
    return result


def _on_step(ctx: JobContext, progress: _Progress, step: int, steps: int) -> None:
    progress.update(step=step, steps=steps)
    ctx.between_steps()  # the previous job's tail may be done: the worker completes it in RQ


def _save(
    chunk: JobSpec, plan: Plan, images: list[Image.Image], output: Path | Store, timings: dict[str, float]
) -> list[dict[str, Any]]:
    """Write each image (temp file + rename on disk, one PUT on an object store); PNG encoding
    releases the GIL, so a thread per image overlaps them. A full or read-only disk, or an
    unreachable bucket, is the worker's problem, not the job's."""
    started = time.perf_counter()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    records = [_item_record(chunk, item, key, index) | {"created": created} for key, item, index in plan.todo]

    def save(pair: tuple[dict[str, Any], Image.Image]) -> None:
        record, image = pair
        assert isinstance(output, Path)
        path = output / record["file_name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, png_bytes(image, record), temp_dir(output))

    if isinstance(output, Store):
        with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
            blobs = list(pool.map(lambda pair: png_bytes(pair[1], pair[0]), zip(records, images, strict=True)))
        put_all(output, {r["file_name"]: blob for r, blob in zip(records, blobs, strict=True)})
    else:
        try:
            with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
                list(pool.map(save, zip(records, images, strict=True)))
        except OSError as exc:
            if exc.errno in ENVIRONMENT_ERRNOS:
                raise unavailable(output, exc) from None
            raise
        finally:
            drop_temp_dir(output)
    timings["save_s"] = time.perf_counter() - started
    per_image = {k: round(v / len(records), 4) for k, v in timings.items()}
    for record in records:
        record["timings"] = per_image | {"batch": len(records)}
    return records


def _record(
    conn: redis.Redis | None,
    queue_name: str,
    job: Job | None,
    execution: str | None,
    chunk: JobSpec,
    plan: Plan,
    output: Path | Store,
    records: list[dict[str, Any]],
    started: float,
) -> int:
    """Append the metadata lines and mark the items done, as one step under the metadata lock,
    only while this execution still owns the job. Returns the images newly counted.

    Lines are skipped for items already recorded, and for items an earlier execution was about
    to record (its intent offset) when the file already has them from that offset on."""
    if isinstance(output, Store):
        return _record_part(conn, queue_name, job, execution, chunk, plan, output, records, started)
    if conn is None or job is None or execution is None:  # a plain RQ worker or a direct call: no fence
        with locked_metadata(output) as meta:
            meta.append(records)
        return len(records)
    ledger = Ledger(conn)
    keys = {"started_key": job.started_job_registry.key, "items_key": items_key(queue_name)}
    keys["intents_key"] = intents_key(queue_name)
    with locked_metadata(output) as meta:
        begun = ledger.begin(**keys, member=execution, offset=meta.size, keys=plan.keys)
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
                there = meta.files_from(found.intent, {r["file_name"] for r in mine})
                mine = [r for r in mine if r["file_name"] not in there]
            lines += mine
        try:
            meta.append(lines)
        except OSError as exc:
            raise unavailable(output, exc) from None
        counted = _commit(ledger, keys, queue_name, job, execution, chunk, plan, len(records), started)
    if counted is None:
        raise JobLost(f"job {job.id}: this worker lost it while recording; the next owner reconciles")
    return counted


def _commit(
    ledger: Ledger,
    keys: dict[str, str],
    queue_name: str,
    job: Job,
    execution: str,
    chunk: JobSpec,
    plan: Plan,
    written: int,
    started: float,
) -> int | None:
    now = time.time()
    return ledger.commit(
        **keys,
        images_key=images_key(queue_name),
        recent_key=recent_key(queue_name),
        member=execution,
        now=now,
        window_start=now - RECENT_WINDOW_S,
        recent_member=f"{job.id}:{written}:{time.perf_counter() - started:.3f}",
        images={key: item.num_images for key, item in zip(plan.keys, chunk.items, strict=True)},
    )


def _record_part(
    conn: redis.Redis | None,
    queue_name: str,
    job: Job | None,
    execution: str | None,
    chunk: JobSpec,
    plan: Plan,
    store: Store,
    records: list[dict[str, Any]],
    started: float,
) -> int:
    """On an object store: BEGIN (which items are recorded already), PUT this execution's
    metadata part with the others' lines, COMMIT. An execution that lost the job deletes its
    part (see :mod:`worker.output.objects` for the one case it cannot)."""
    if conn is None or job is None or execution is None:
        name = metadata_part(job.id if job else "direct", execution or f"{time.time_ns()}")
        put_all(store, {name: part_bytes(records)})
        return len(records)
    ledger = Ledger(conn)
    keys = {"started_key": job.started_job_registry.key, "items_key": items_key(queue_name)}
    keys["intents_key"] = intents_key(queue_name)
    begun = ledger.begin(**keys, member=execution, offset=0, keys=plan.keys)
    if begun is None:
        raise JobLost(f"job {job.id}: this worker lost it while stalled; recorded nothing")
    recorded = {key for key, found in zip(plan.keys, begun, strict=True) if found.recorded}
    lines = [r for r in records if r["key"] not in recorded]
    name = metadata_part(job.id, execution)
    if lines:
        put_all(store, {name: part_bytes(lines)})
    counted = _commit(ledger, keys, queue_name, job, execution, chunk, plan, len(records), started)
    if counted is None:
        if lines:
            drop_part(store, name)
        raise JobLost(f"job {job.id}: this worker lost it while recording; its metadata part is withdrawn")
    return counted
