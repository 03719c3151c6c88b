"""Enqueues in progress: a campaign knows it is still growing.

Without this record a campaign's size was what Redis held so far: while ``producer enqueue``
was still reading its file (a big file, a slow disk, ``--max-queued`` waiting for room, a
producer paused or on another host), the jobs queued so far could all finish, and ``producer
wait`` said drained, ``status`` said complete and burst workers left, with most rows unread.

``diffq:<queue>:enqueues`` is a hash from an enqueue's id (the file's fingerprint: its bytes
and the flags, so the same enqueue run again from any host is the same entry) to a JSON record:
the file, the host and pid, rows read so far, rows in the file when known, and a heartbeat the
producer refreshes every :data:`BEAT_S` seconds (a third of the heartbeat TTL, if less) from a
thread of its own. The entry is removed
when the enqueue has read its whole file. One that ended mid-file (Ctrl-C, ``producer
cancel``, an error) marks its entry stopped; one whose heartbeat is older than the heartbeat
TTL belongs to a producer that died or is paused mid-file. Either way the campaign is not
complete until that enqueue is run again (as a cancelled job's images are missing until then).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass

import redis

#: how often a running enqueue refreshes its entry, at most (and three times per heartbeat TTL)
BEAT_S = 5.0


def enqueues_key(queue: str) -> str:
    return f"diffq:{queue}:enqueues"


@dataclass
class EnqueueRun:
    """One enqueue's entry: what it reads, who runs it, how far it is."""

    id: str
    file: str
    host: str
    pid: int
    rows_read: int = 0
    rows_total: int | None = None
    started_at: float = 0.0
    beat_at: float = 0.0
    #: it ended mid-file (Ctrl-C, an error): no more rows come until it is run again
    stopped: bool = False

    def alive(self, ttl: float, now: float | None = None) -> bool:
        return not self.stopped and (time.time() if now is None else now) - self.beat_at <= ttl

    def where(self) -> str:
        """``row 8 of 40`` (or ``row 8`` when the file's length is not known): rows read so far."""
        return f"row {self.rows_read}" + (f" of {self.rows_total}" if self.rows_total is not None else "")

    def describe(self, ttl: float, now: float | None = None) -> str:
        """One line for status and wait."""
        now = time.time() if now is None else now
        if self.alive(ttl, now):
            return f"enqueue of {self.file} on {self.host} is still running (read to {self.where()})"
        if self.stopped:
            return f"enqueue of {self.file} on {self.host} stopped at {self.where()}: run it again"
        return (
            f"enqueue of {self.file} on {self.host} stopped at {self.where()} (not heard from for "
            f"{now - self.beat_at:.0f}s): run it again"
        )


def parse(raw: bytes | str) -> EnqueueRun | None:
    try:
        return EnqueueRun(**json.loads(raw))
    except (ValueError, TypeError):
        return None


def runs_of(entries: dict[bytes, bytes]) -> list[EnqueueRun]:
    """The parsed entries of an enqueues hash (``HGETALL``), oldest first."""
    found = [run for run in map(parse, entries.values()) if run is not None]
    return sorted(found, key=lambda run: run.started_at)


class EnqueueRecord:
    """The producer's side: the entry while the file is read, a heartbeat thread, the entry
    removed at the end. Redis calls from the thread that fail are skipped (the next beat tries
    again); a producer that cannot beat for a TTL is shown as stopped, never as done."""

    def __init__(
        self, conn: redis.Redis, queue: str, run_id: str, file: str, rows_total: int | None, ttl: float = 30.0
    ) -> None:
        self.conn = conn
        self.key = enqueues_key(queue)
        self.beat_s = min(BEAT_S, ttl / 3)  # as a worker's keeper beats
        now = time.time()
        self.run = EnqueueRun(
            id=run_id, file=file, host=socket.gethostname(), pid=os.getpid(), rows_total=rows_total,
            started_at=now, beat_at=now,
        )  # fmt: skip
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> EnqueueRecord:
        self._write()
        self._thread = threading.Thread(target=self._beat, name="diffq-enqueue-beat", daemon=True)
        self._thread.start()
        return self

    def rows(self, read: int) -> None:
        """Rows read so far (written with the next beat)."""
        self.run.rows_read = read

    def _write(self) -> None:
        self.run.beat_at = time.time()
        self.conn.hset(self.key, self.run.id, json.dumps(asdict(self.run)))

    def _beat(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._write()
            except redis.RedisError:
                continue

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """The file was read whole: the entry goes. Ended mid-file (Ctrl-C, Redis down, a
        ``producer cancel``, an error): the entry stays, marked stopped where Redis still
        answers, so the campaign is not called complete without the rows it did not queue."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.beat_s + 5)
        try:
            if exc is None:
                self.conn.hdel(self.key, self.run.id)
            else:
                self.run.stopped = True
                self._write()
        except redis.RedisError:
            if exc is None:
                raise
