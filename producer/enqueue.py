"""Enqueue a prompts file: validate it whole, then stream it into Redis in pipelined batches.

Two passes over the file keep memory flat whatever its size: the first validates every row
(so a bad file enqueues nothing), the second groups rows into chunks and enqueues them.
Item keys are content hashes; an item whose key is already in ``diffq:<queue>:items`` (queued,
running, failed or done) is not enqueued again, so re-running the same command after a crash
resumes the campaign and adds nothing twice.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.utils import now

from common.errors import CampaignCancelled, ConfigError, InputFileError
from common.jobspec import GenParams, JobSpec, PromptItem
from common.lanes import group_lane
from common.ledger import MAKE, REDO_PREFIX, REMAKE_ALL, REMAKE_IMAGES, Ledger, done_in, is_done
from common.naming import IMAGES_DIR, image_path, image_relpath, item_key, job_id, output_id
from common.queues import TASK_FUNC, cancelled_key, get_queue, items_key, queued_jobs, seen_key, seen_member
from common.rq_keys import rq_names
from common.settings import Settings
from common.storage import Store, is_url, local_path, problem
from producer.metadata import recorded_names
from producer.reader import Row, RowDefaults, RowError, read_rows

BATCH_ITEMS = 2000
#: times a pipeline of CLAIMs is sent again after Redis lost its scripts (a restart)
NO_SCRIPT_RETRIES = 5
MAX_ERRORS_SHOWN = 20
RESULT_TTL = 7 * 24 * 3600
FAILURE_TTL = 30 * 24 * 3600


@dataclass(frozen=True, kw_only=True)
class EnqueueOptions:
    """How the chunks of one file are queued; the defaults live in :class:`~common.settings.Settings`."""

    output: str
    #: S3-compatible endpoint for an s3:// output (empty: AWS, or botocore's AWS_ENDPOINT_URL)
    s3_endpoint_url: str = ""
    chunk_size: int
    job_timeout: int
    max_retries: int
    retry_intervals: tuple[int, ...]
    #: at most this many jobs queued; 0: no limit
    max_queued: int = 0
    #: the jobs go to the group lane (:mod:`common.lanes`): only multi-GPU groups take them
    latency: bool = False
    #: reward scores each job's worker computes (``--score``, common/scorers.py)
    scores: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings, output: str) -> EnqueueOptions:
        return cls(
            output=output,
            s3_endpoint_url=settings.s3_endpoint_url,
            chunk_size=settings.chunk_size,
            job_timeout=settings.job_timeout,
            max_retries=settings.max_retries,
            retry_intervals=tuple(settings.retry_intervals()),
            max_queued=settings.max_queued,
        )


@dataclass
class EnqueueReport:
    rows: int = 0
    new_items: int = 0
    known_items: int = 0
    failed_items: int = 0
    missing_images: int = 0
    #: done items whose images could not be checked (a local output this host cannot see)
    unchecked_done: int = 0
    #: items done for another output of this queue: a queue is one campaign with one output
    other_output: int = 0
    jobs: int = 0
    images: int = 0


def check_file(
    path: Path,
    defaults: RowDefaults,
    on_row: Callable[[], None] | None = None,
    warnings: list[str] | None = None,
    settings_seen: dict[GenParams, int] | None = None,
    overridden: dict[str, int] | None = None,
) -> int:
    """Validate every row; return the number of rows, or raise listing the bad ones. Rows that
    run a known few-step adapter or model against its recipe are added to ``warnings``
    (``FILE:LINE: ...``), the first few of them; ``settings_seen`` counts the rows of each
    chunk's settings (what ``--dry-run`` counts jobs from); ``overridden`` counts, for each
    column named in it, the rows whose own cell won over that column's flag."""
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
        if settings_seen is not None:
            settings_seen[result.params] = settings_seen.get(result.params, 0) + 1
        if overridden is not None:
            for column in overridden.keys() & result.cells:
                overridden[column] += 1
        if result.warning and warnings is not None and len(warnings) < MAX_ERRORS_SHOWN:
            warnings.append(f"{path}:{result.line}: {result.warning}")
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


def file_fingerprint(path: Path, defaults: RowDefaults) -> str:
    """The content of ``path`` and the flags it is read with: a file with this fingerprint that
    passed :func:`check_file` once passes it again (hashing 10^7 rows takes about a second;
    checking them, about two minutes)."""
    digest = hashlib.sha256(f"{defaults!r}\t{os.getcwd()}".encode())  # relative adapter paths resolve here
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def check_output(location: str, endpoint_url: str = "") -> str:
    """The output as jobs will name it: an absolute folder, or a URL whose bucket exists and
    takes a write with these credentials (one small object written and deleted), so a typo in
    the bucket or a missing key is one line here instead of every job failing on the workers."""
    if not is_url(location):
        folder = local_path(location)
        for path in (folder, *folder.parents):
            if path.exists():
                if not path.is_dir():
                    what = "is a file" if path == folder else f"cannot be made: {path} is a file"
                    raise ConfigError(f"--output {location!r} {what}; give a folder; nothing was enqueued")
                break
        return str(folder)
    store = Store(location.rstrip("/"), endpoint_url)
    try:
        store.probe()
    except Exception as exc:
        line = problem(exc, store.location, endpoint_url)
        if line is None:
            raise
        raise ConfigError(f"--output: {line}; nothing was enqueued") from None
    return store.location


def _chunks(
    batches: Iterator[list[tuple[str, Row]]], size: int
) -> Iterator[tuple[GenParams, list[tuple[str, PromptItem]]] | None]:
    """Group new items into chunks of equal :class:`GenParams`, ``size`` items each (the last may
    be short). Yields ``None`` after each batch, so the caller can queue what is ready before the
    next batch is looked up; an item that appears twice in the file is chunked once."""
    buffers: dict[GenParams, list[tuple[str, PromptItem]]] = {}
    pending: set[str] = set()
    for batch in batches:
        for key, row in batch:
            if key in pending:
                continue
            pending.add(key)
            buffer = buffers.setdefault(row.params, [])
            buffer.append((key, row.item))
            if len(buffer) == size:
                del buffers[row.params]
                pending.difference_update(k for k, _ in buffer)
                yield row.params, buffer
        yield None
    yield from buffers.items()


class Enqueuer:
    """Pass two: look each batch of rows up in the ledger, chunk the new ones, and queue each chunk
    with the ledger's CLAIM script (a pipeline of them per batch).

    CLAIM queues a chunk only if none of its items was queued meanwhile, atomically, so producers
    that race on the same file queue every item once; what another producer took first is
    reported as known, and the rest of that chunk is queued as a smaller chunk."""

    def __init__(self, conn: redis.Redis, queue_name: str, options: EnqueueOptions) -> None:
        self.conn = conn
        self.campaign = queue_name
        lane = group_lane(queue_name) if options.latency else queue_name
        self.queue: Queue = get_queue(lane, conn, lean=True)
        self.ledger = Ledger(conn, lane)
        self.items_key = items_key(queue_name)
        self.options = options
        self.report = EnqueueReport()
        #: called with the queue's length while waiting for room (``max_queued``)
        self.on_wait: Callable[[int], None] | None = None
        self.sleep: Callable[[float], None] = time.sleep
        self._redo: dict[str, int] = {}  # done items whose images are gone: REMAKE_IMAGES or REMAKE_ALL
        self._store = Store(options.output, options.s3_endpoint_url) if is_url(options.output) else None
        self._output = Path(options.output)
        #: visible: missing images can be checked from here; gone: the whole folder was deleted
        self.output_visible, self.output_gone = self._visibility(queue_name)
        self._began = time.time()  # a producer cancel after this stops this enqueue
        self._oid = output_id(options.output)
        self._listed: set[str] | None = None  # an object store's image names, listed once when needed
        self._recorded: set[str] | None = None  # image names with a metadata line, read once when needed

    def _visibility(self, queue_name: str) -> tuple[bool, bool]:
        """A local folder this host saw before and that is gone now was deleted: every done image
        in it is missing. One this host never saw may be another host's (a producer beside Redis,
        workers elsewhere): then only Redis is trusted."""
        if self._store is not None:
            return True, False
        member = seen_member(self.options.output)
        if self._output.is_dir():
            self.conn.sadd(seen_key(queue_name), member)
            return True, False
        gone = bool(self.conn.sismember(seen_key(queue_name), member))
        return gone, gone

    def classify(self, batch: list[tuple[str, Row]]) -> list[tuple[str, Row]]:
        """Return the items of ``batch`` that are neither queued, running, failed nor done.

        A read-only look-up: CLAIM decides for good when the chunk is queued."""
        if not batch:
            return []
        unique = list(dict.fromkeys(key for key, _ in batch))
        states = dict(zip(unique, self.conn.hmget(self.items_key, unique), strict=True))
        owners = {_owner(v) for v in states.values() if v is not None and not is_done(v)}
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
            status = statuses.get(_owner(state)) if state is not None and not is_done(state) else None
            elsewhere = done_in(state)
            if elsewhere is not None and elsewhere != self._oid:
                self.report.other_output += 1  # done, in another output: not this one's to check
            elif is_done(state) and self._images_missing(key, row):
                self.report.missing_images += 1
                self._redo[key] = REMAKE_IMAGES if self._lines_there(key, row) else REMAKE_ALL
                fresh.append((key, row))
            elif state is None or (not is_done(state) and _lost(status)):
                fresh.append((key, row))  # new, or its job is gone, stopped or cancelled: lost
            elif status == b"failed":
                self.report.failed_items += 1
            else:
                self.report.known_items += 1
        return fresh

    def _images_missing(self, key: str, row: Row) -> bool:
        """Done means recorded in Redis *and* in storage: an image deleted since is made again.
        Checked only where the output folder is visible from here (a producer on another
        host than the workers trusts Redis). On an object store the ``images/`` prefix is listed
        once, at the first done item (1,000 names per request), never one request per image."""
        if not self.output_visible:
            self.report.unchecked_done += 1
            return False
        if self.output_gone:
            return True
        if self._store is not None:
            if self._listed is None:
                self._listed = set(self._store.listing(IMAGES_DIR))
            ext = row.params.file_format.extension
            return not all(image_relpath(key, i, ext) in self._listed for i in range(row.item.num_images))
        ext = row.params.file_format.extension
        return not all(image_path(self._output, key, i, ext).exists() for i in range(row.item.num_images))

    def _lines_there(self, key: str, row: Row) -> bool:
        """Are the item's metadata lines still there? Its images are made again either way; its
        lines are written again only where they are gone (an object store that lost parts, a
        deleted folder), never twice. The metadata is read once, at the first such item."""
        if self.output_gone:
            return False
        if self._recorded is None:
            store = self._store or Store(self.options.output)
            self._recorded = recorded_names(store)
        ext = row.params.file_format.extension
        return all(image_relpath(key, i, ext) in self._recorded for i in range(row.item.num_images))

    def requeue(self, items: list[tuple[GenParams, str, PromptItem]]) -> int:
        """Queue done items again to remake their images and lines (``producer verify --repair``
        drops their lines first); CLAIM takes them off the count. Returns the items queued."""
        before = self.report.new_items
        chunks: dict[GenParams, list[tuple[str, PromptItem]]] = {}
        for params, key, item in items:
            self._redo[key] = REMAKE_ALL
            chunks.setdefault(params, []).append((key, item))
        size = self.options.chunk_size
        self._queue([(p, keyed[i : i + size]) for p, keyed in chunks.items() for i in range(0, len(keyed), size)])
        return self.report.new_items - before

    def enqueue(self, path: Path, defaults: RowDefaults, on_row: Callable[[int], None] | None = None) -> EnqueueReport:
        def batches() -> Iterator[list[tuple[str, Row]]]:
            batch: list[tuple[str, Row]] = []
            for row in read_rows(path, defaults):
                if not isinstance(row, Row):
                    continue
                self.report.rows += 1
                if on_row:
                    on_row(self.report.rows)
                batch.append((item_key(row.params, row.item), row))
                if len(batch) >= BATCH_ITEMS:
                    yield self.classify(batch)
                    batch = []
            yield self.classify(batch)

        ready: list[tuple[GenParams, list[tuple[str, PromptItem]]]] = []
        for chunk in _chunks(batches(), self.options.chunk_size):
            if chunk is None:
                self._queue(ready)  # before the next batch is looked up
                ready = []
            else:
                ready.append(chunk)
        self._queue(ready)
        return self.report

    def _queue(self, chunks: list[tuple[GenParams, list[tuple[str, PromptItem]]]]) -> None:
        """Queue ``chunks``, no more at a time than :meth:`_room` allows."""
        while chunks:
            room = self._room()
            self._claim(chunks[:room])
            chunks = chunks[room:]

    def _room(self) -> int:
        """How many jobs may be queued now: wait while the queue holds ``max_queued`` jobs or
        more (checked every second; the workers are taking them meanwhile)."""
        limit = self.options.max_queued
        if not limit:
            return 1 << 30
        delay = 0.05
        while (queued := queued_jobs(self.conn, self.campaign)) >= limit:
            self._check_not_cancelled()
            if self.on_wait:
                self.on_wait(queued)
            self.sleep(delay)
            delay = min(1.0, delay * 2)
        return limit - queued

    def _check_not_cancelled(self) -> None:
        at = self.conn.get(cancelled_key(self.campaign))
        if at is not None and float(at) > self._began:
            raise CampaignCancelled(
                f"queue {self.campaign!r} was cancelled (producer cancel) while this enqueue ran: "
                f"{self.report.jobs} job(s) queued before that; run the same command to resume"
            )

    def _claim(self, chunks: list[tuple[GenParams, list[tuple[str, PromptItem]]]]) -> None:
        """CLAIM each chunk (one pipeline); chunks that lost items to another producer are
        queued again without them."""
        if chunks:
            self._check_not_cancelled()
        while chunks:
            specs, answers = self._claim_pipeline(chunks)
            retry: list[tuple[GenParams, list[tuple[str, PromptItem]]]] = []
            for (params, keyed), spec, taken in zip(chunks, specs, answers, strict=True):
                taken_keys = {t.decode() if isinstance(t, bytes) else str(t) for t in taken}
                if not taken_keys:
                    self.report.new_items += len(keyed)
                    self.report.images += spec.num_images
                    self.report.jobs += 1
                    continue
                if "*job" in taken_keys:  # a live job with this very id: its items are queued
                    taken_keys = {key for key, _ in keyed}
                self.report.known_items += len(taken_keys)
                left = [(key, item) for key, item in keyed if key not in taken_keys]
                if left:
                    retry.append((params, left))
            chunks = retry

    def _claim_pipeline(
        self, chunks: list[tuple[GenParams, list[tuple[str, PromptItem]]]]
    ) -> tuple[list[JobSpec], list[Any]]:
        """One pipeline of CLAIMs. redis-py loads a pipeline's scripts before its retry loop, so
        a Redis that restarted in between answers ``NoScriptError`` (its script cache is empty):
        the pipeline is sent again, scripts loaded anew. CLAIM is idempotent (a chunk that did
        go through answers that its job is live), so nothing is queued twice."""
        for attempt in range(1, NO_SCRIPT_RETRIES + 1):
            try:
                with self.conn.pipeline(transaction=False) as pipe:
                    specs = [self._job(pipe, params, keyed) for params, keyed in chunks]
                    return specs, pipe.execute()
            except redis.exceptions.NoScriptError:
                if attempt == NO_SCRIPT_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def _job(self, pipe: redis.client.Pipeline, params: GenParams, keyed: list[tuple[str, PromptItem]]) -> JobSpec:
        """Queue CLAIM of one chunk's job on ``pipe``; return its spec."""
        keys = [key for key, _ in keyed]
        spec = JobSpec(
            params=params, output=self.options.output, items=tuple(i for _, i in keyed), scores=self.options.scores
        )
        jid = job_id(keys, spec.output, self.campaign)  # the same id in either lane
        job = self.queue.create_job(
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
            status=JobStatus.QUEUED,
        )
        job.origin = self.queue.name
        job.enqueued_at = now()
        fields: list[bytes | str] = []
        for name, value in job.to_dict().items():
            fields += [name, value if isinstance(value, bytes | str) else str(value)]
        self.ledger.claim(
            client=pipe,
            job_id=jid,
            model=params.model,
            keys=keys,
            redo=[self._redo.get(key, MAKE) for key in keys],
            images=[item.num_images for _, item in keyed],
            job_fields=fields,
        )
        return spec


def _lost(status: bytes | None) -> bool:
    """An item whose job is gone, or ended without failing (stopped, cancelled, or finished
    without recording it), is made by nobody: it is queued again."""
    return status is None or (status.decode() in rq_names().ended and status != b"failed")


def _owner(state: bytes | None) -> str:
    """The job id an item's ledger state points at (``<id>`` or ``r:<id>``)."""
    text = (state or b"").decode()
    return text.removeprefix(REDO_PREFIX)
