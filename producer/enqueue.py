"""Enqueue a prompts file: validate it whole, then stream it into Redis in pipelined batches.

Two passes over the file keep memory flat whatever its size: the first validates every row
(so a bad file enqueues nothing), the second groups rows into chunks and enqueues them.
Item keys are content hashes; an item whose key is already in ``diffq:<queue>:items`` (queued,
running, failed or done) is not enqueued again, so re-running the same command after a crash
resumes the campaign and adds nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from rq import Queue, Retry
from rq.job import Job

from common.errors import InputFileError
from common.jobspec import GenParams, JobSpec, PromptItem
from common.naming import image_path, item_key, job_id
from common.queues import DONE, TASK_FUNC, get_queue, items_key
from producer.reader import Row, RowDefaults, RowError, read_rows

BATCH_ITEMS = 2000
MAX_ERRORS_SHOWN = 20
RESULT_TTL = 7 * 24 * 3600
FAILURE_TTL = 30 * 24 * 3600


@dataclass
class EnqueueOptions:
    output: str
    chunk_size: int = 4
    job_timeout: int = 3600
    max_retries: int = 3
    retry_intervals: tuple[int, ...] = (5, 30, 120)


@dataclass
class EnqueueReport:
    rows: int = 0
    new_items: int = 0
    known_items: int = 0
    failed_items: int = 0
    missing_images: int = 0
    jobs: int = 0
    images: int = 0


def check_file(path: Path, defaults: RowDefaults, on_row: Callable[[], None] | None = None) -> int:
    """Validate every row; return the number of rows, or raise listing the bad ones."""
    errors: list[RowError] = []
    ids: dict[str, tuple[str, int]] = {}
    rows = 0
    for result in read_rows(path, defaults):
        if on_row:
            on_row()
        if isinstance(result, RowError):
            errors.append(result)
            continue
        rows += 1
        row_id = result.item.id
        if row_id is not None:
            key = item_key(result.params, result.item)
            first = ids.setdefault(row_id, (key, result.line))
            if first[0] != key:
                errors.append(RowError(result.line, f"id {row_id!r} is also on line {first[1]} with other content"))
    if errors:
        shown = [f"{path}:{e.line}: {e.message}" for e in errors[:MAX_ERRORS_SHOWN]]
        more = len(errors) - len(shown)
        if more:
            shown.append(f"... and {more} more")
        shown.append(f"{path}: {len(errors)} bad row(s); nothing was enqueued. Fix them and run again.")
        raise InputFileError("\n".join(shown))
    if rows == 0:
        raise InputFileError(f"{path}: no rows with a prompt; nothing was enqueued")
    return rows


def _chunks(rows: Iterator[Row], filter_new: Callable[[list[tuple[str, Row]]], list[tuple[str, Row]]], size: int):
    """Group new items into chunks of equal :class:`GenParams`, ``size`` items each (the last may be short)."""
    buffers: dict[GenParams, list[tuple[str, PromptItem]]] = {}
    pending: set[str] = set()
    batch: list[tuple[str, Row]] = []

    def drain() -> Iterator[tuple[GenParams, list[tuple[str, PromptItem]]]]:
        for key, row in filter_new(batch):
            if key in pending:
                continue
            pending.add(key)
            buffer = buffers.setdefault(row.params, [])
            buffer.append((key, row.item))
            if len(buffer) == size:
                del buffers[row.params]
                pending.difference_update(k for k, _ in buffer)
                yield row.params, buffer
        batch.clear()

    for row in rows:
        batch.append((item_key(row.params, row.item), row))
        if len(batch) >= BATCH_ITEMS:
            yield from drain()
    yield from drain()
    yield from buffers.items()


class Enqueuer:
    """Pass two: dedupe against Redis and enqueue chunk jobs, a pipeline per batch."""

    def __init__(self, conn: redis.Redis, queue_name: str, options: EnqueueOptions) -> None:
        self.conn = conn
        self.queue: Queue = get_queue(queue_name, conn, lean=True)
        self.items_key = items_key(queue_name)
        self.options = options
        self.report = EnqueueReport()
        self._ready: list[tuple[GenParams, list[tuple[str, PromptItem]]]] = []
        self._output = Path(options.output)
        self._output_visible = self._output.is_dir()

    def classify(self, batch: list[tuple[str, Row]]) -> list[tuple[str, Row]]:
        """Return the items of ``batch`` that are neither queued, running, failed nor done."""
        self._flush()  # chunks made from earlier batches must be visible to this lookup
        if not batch:
            return []
        unique = list(dict.fromkeys(key for key, _ in batch))
        states = dict(zip(unique, self.conn.hmget(self.items_key, unique), strict=True))
        owners = {v.decode() for v in states.values() if v is not None and v != DONE.encode()}
        with self.conn.pipeline(transaction=False) as pipe:
            for owner in owners:
                pipe.hget(Job.key_for(owner), "status")
            statuses = dict(zip(owners, pipe.execute(), strict=True))
        fresh, seen = [], set()
        for key, row in batch:
            if key in seen:
                self.report.known_items += 1
                continue
            seen.add(key)
            state = states[key]
            if state == DONE.encode() and self._images_missing(key, row):
                self.report.missing_images += 1
                fresh.append((key, row))
            elif state is None or (state != DONE.encode() and statuses.get(state.decode()) is None):
                fresh.append((key, row))
            elif state != DONE.encode() and statuses.get(state.decode()) == b"failed":
                self.report.failed_items += 1
            else:
                self.report.known_items += 1
        return fresh

    def _images_missing(self, key: str, row: Row) -> bool:
        """Done means recorded in Redis *and* on disk: an image deleted since is made again.
        Checked only where the output folder is visible from here (a producer on another
        host than the workers trusts Redis)."""
        if not self._output_visible:
            return False
        return not all(image_path(self._output, key, i).exists() for i in range(row.item.num_images))

    def enqueue(self, path: Path, defaults: RowDefaults, on_row: Callable[[int], None] | None = None) -> EnqueueReport:
        rows = (r for r in read_rows(path, defaults) if isinstance(r, Row))

        def counted() -> Iterator[Row]:
            for row in rows:
                self.report.rows += 1
                if on_row:
                    on_row(self.report.rows)
                yield row

        for chunk in _chunks(counted(), self.classify, self.options.chunk_size):
            self._ready.append(chunk)
        self._flush()
        return self.report

    def _flush(self) -> None:
        chunks = self._ready
        if not chunks:
            return
        with self.conn.pipeline(transaction=True) as pipe:
            datas = []
            for params, keyed in chunks:
                keys = [key for key, _ in keyed]
                spec = JobSpec(params=params, output=self.options.output, items=tuple(i for _, i in keyed))
                jid = job_id(keys, spec.output)
                datas.append(
                    Queue.prepare_data(
                        TASK_FUNC,
                        kwargs={"spec": spec.to_dict()},
                        job_id=jid,
                        description=spec.describe(),
                        timeout=self.options.job_timeout,
                        result_ttl=RESULT_TTL,
                        failure_ttl=FAILURE_TTL,
                        retry=Retry(max=self.options.max_retries, interval=list(self.options.retry_intervals))
                        if self.options.max_retries
                        else None,
                    )
                )
                pipe.hset(self.items_key, mapping=dict.fromkeys(keys, jid))
                self.report.new_items += len(keys)
                self.report.images += spec.num_images
                self.report.jobs += 1
            self.queue.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
        chunks.clear()
