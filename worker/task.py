"""The RQ job function: turn one chunk spec into images on disk.

Reads top to bottom as the steps it takes: validate → skip what is done → warm pipeline →
adapter → run the batch → write files → record. It is idempotent: every output name comes
from the content hash, items already done are skipped, and an image found on disk from an
interrupted attempt is kept, not regenerated, so a retry overwrites nothing complete.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from PIL import Image
from rq import get_current_job
from rq.job import Job

from common.jobspec import JobSpec, PromptItem
from common.naming import image_path, image_relpath, item_key
from common.queues import DONE, RECENT_WINDOW_S, images_key, items_key, recent_key
from worker import runtime
from worker.faults import fail_early_attempts, install_oom_fault
from worker.images import (
    append_metadata,
    png_bytes,
    prepare_output,
    recorded_files,
    remove_stale_temps,
    write_atomic,
)

log = logging.getLogger("diffq.worker")

META_SAVE_INTERVAL_S = 0.5


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


def _item_record(spec: JobSpec, item: PromptItem, key: str, index: int) -> dict[str, Any]:
    p = spec.params
    return {
        "file": image_relpath(key, index),
        "key": key,
        "index": index,
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
    started = time.perf_counter()
    rt = runtime.current()
    job = get_current_job()
    queue_name = job.origin if job is not None else rt.settings.queue
    conn = job.connection if job is not None else None

    # 1. Validate the payload: it came from Redis, so it is untrusted
    chunk = JobSpec.from_dict(spec)
    output = prepare_output(chunk.output, rt.settings.output_root)
    attempt = 1
    if job is not None:
        attempt = job.meta["attempts"] = int(job.meta.get("attempts", 0)) + 1
        job.save_meta()
    fail_early_attempts(attempt, rt.settings.fault_fail_attempts)

    # 2. Skip items already done; keep images an interrupted attempt finished
    keys = [item_key(chunk.params, item) for item in chunk.items]
    states = conn.hmget(items_key(queue_name), keys) if conn is not None else [None] * len(keys)
    todo: list[tuple[str, PromptItem, int]] = []  # (key, item, image index) still to generate
    recovered: list[dict[str, Any]] = []
    skipped = 0
    for key, item, state in zip(keys, chunk.items, states, strict=True):
        paths = [image_path(output, key, i) for i in range(item.num_images)]
        if state == DONE.encode() and all(p.exists() for p in paths):
            skipped += item.num_images
            continue
        for index, path in enumerate(paths):
            if path.exists():
                recovered.append(_item_record(chunk, item, key, index) | {"recovered": True})
            else:
                remove_stale_temps(path)
                todo.append((key, item, index))
    if recovered:
        # the interrupted attempt may have died after writing its metadata lines
        already = recorded_files(output, {r["file"] for r in recovered})
        recovered = [r for r in recovered if r["file"] not in already]
    progress = _Progress(job, images=chunk.num_images)
    timings: dict[str, float] = {"load_s": 0.0, "encode_s": 0.0, "denoise_s": 0.0, "decode_s": 0.0, "save_s": 0.0}
    records: list[dict[str, Any]] = []

    if todo:
        # 3. Get the warm pipeline and switch to this chunk's adapter
        loaded, timings["load_s"] = rt.pipelines.get(chunk.params.model)
        rt.pipelines.use_adapter(loaded, chunk.params.adapter, chunk.params.adapter_scale)

        # 4. Run the chunk as one batch, one seed per image
        def on_step(step: int, steps: int) -> None:
            progress.update(step=step, steps=steps)

        if rt.settings.fault_oom_above >= 0:
            install_oom_fault(loaded.pipe, rt.settings.fault_oom_above)
        shape = (chunk.params.model, chunk.params.width, chunk.params.height)
        limit = rt.batch_limits.get(shape, len(todo))
        result, fitted = rt.pipelines.generate(
            loaded,
            chunk.params,
            prompts=[item.prompt for _, item, _ in todo],
            negatives=[item.negative_prompt for _, item, _ in todo],
            seeds=[item.seed + index for _, item, index in todo],
            max_batch=limit,
            on_step=on_step,
        )
        if fitted < len(todo):
            rt.batch_limits[shape] = fitted
            progress.update(force=True, split_batch=fitted)
        timings.update(encode_s=result.encode_s, denoise_s=result.denoise_s, decode_s=result.decode_s)

        # 5. Write each image under its content-derived name (temp file + rename); PNG
        #    encoding releases the GIL, so a thread per image overlaps them
        save_started = time.perf_counter()
        created = datetime.now(UTC).isoformat(timespec="seconds")
        records = [_item_record(chunk, item, key, index) | {"created": created} for key, item, index in todo]

        def save(pair: tuple[dict[str, Any], Image.Image]) -> None:
            record, image = pair
            path = output / record["file"]
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, png_bytes(image, record))

        with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
            list(pool.map(save, zip(records, result.images, strict=True)))
        progress.update(images_done=skipped + len(recovered) + len(records))
        timings["save_s"] = time.perf_counter() - save_started
        per_image = {k: round(v / len(todo), 4) for k, v in timings.items()}
        for record in records:
            record["timings"] = per_image | {"batch": len(todo)}

    # 6. Record: metadata lines, items done, counters for status
    append_metadata(output, records + recovered)
    written = len(records)
    if conn is not None:
        now = time.time()
        with conn.pipeline(transaction=True) as pipe:
            pipe.hset(items_key(queue_name), mapping=dict.fromkeys(keys, DONE))
            if written:
                pipe.incrby(images_key(queue_name), written)
            pipe.zadd(recent_key(queue_name), {f"{job.id}:{written}": now})
            pipe.zremrangebyscore(recent_key(queue_name), "-inf", now - RECENT_WINDOW_S)
            pipe.execute()
    timings["total_s"] = time.perf_counter() - started
    progress.update(force=True, images_done=chunk.num_images)
    log.info(
        "job %s: %d image(s) written, %d already done, %d recovered in %.2fs",
        job.id if job else "-",
        written,
        skipped,
        len(recovered),
        timings["total_s"],
    )
    return {
        "files": [r["file"] for r in records],
        "skipped": skipped,
        "recovered": len(recovered),
        "output": str(Path(output)),
        "timings": {k: round(v, 4) for k, v in timings.items()},
        "worker": rt.worker_name,
    }
