"""One definition of complete: ``producer status``, ``wait``, ``verify`` and the metrics never
disagree, with each other nor with what happened, over random interleavings of enqueue (whole,
or dying mid-file), take, start, kill, write, cancel, resume and a worker's recovery.

Each step changes a real Redis the way the real actor does: the producer's own ``Enqueuer``
and enqueue record, RQ's moves of a job (``LMOVE`` into the intermediate list, an execution in
the started registry, its heartbeat lapsing), the ledger's BEGIN/COMMIT scripts a worker records
with (a dead worker's write is fenced out), ``producer cancel`` and a worker's recovery. The
test keeps its own account of where each job is and which rows are written; after every step
the four tools must say what that account says.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis
from prometheus_client import generate_latest
from rq.job import Job
from rq.serializers import JSONSerializer

from common.enqueues import EnqueueRecord
from common.jobspec import JobSpec
from common.ledger import Ledger, is_done
from common.naming import item_key
from common.queues import get_queue, items_key
from common.reconcile import intermediate_key
from common.rq_keys import started_registry_key
from common.settings import Settings
from producer.cancel import cancel
from producer.enqueue import EnqueueOptions, Enqueuer
from producer.metrics import registry_for
from producer.reader import RowDefaults
from producer.status import collect, wait_verdict
from worker.serving.recovery import requeue_abandoned

ROWS = 6
TTL = 30
STEPS = 40
OVER = {"finished", "cancelled"}  # places a job does not leave by itself


class World:
    """The campaign as the test made it: each job's place and the rows written."""

    def __init__(self, conn: redis.Redis, tmp_path: Path) -> None:
        self.conn = conn
        self.file = tmp_path / "rows.csv"
        self.file.write_text("prompt\n" + "".join(f"row {i}\n" for i in range(ROWS)), encoding="utf-8")
        settings = Settings.load(queue="diffq", output=str(tmp_path / "out"), chunk_size=1)
        self.options = EnqueueOptions.from_settings(settings, str(tmp_path / "out"))
        self.defaults = RowDefaults(model="tiny", width=64, height=64, steps=2)
        self.queue = get_queue("diffq", conn)
        self.ledger = Ledger(conn, "diffq")
        self.places: dict[str, str] = {}
        self.members: dict[str, str] = {}  # job id -> its execution in the started registry
        #: executions taken from their worker (recovered or cancelled): a write of one is fenced out
        self.stale: list[tuple[str, str]] = []
        self.stopped_entry = False  # an enqueue stopped mid-file, not run again since
        self.executions = 0

    # -- the actors ---------------------------------------------------------------------------

    def enqueue(self, dies_at: int | None) -> None:
        """The producer: the whole file, or one that dies (Ctrl-C) after ``dies_at`` rows."""

        def on_row(rows: int) -> None:
            record.rows(rows)
            if dies_at is not None and rows >= dies_at:
                raise KeyboardInterrupt

        record = EnqueueRecord(self.conn, "diffq", "the-file", str(self.file), ROWS, ttl=TTL)
        try:
            with record:
                Enqueuer(self.conn, "diffq", self.options).enqueue(self.file, self.defaults, on_row=on_row)
        except KeyboardInterrupt:
            self.stopped_entry = True
            return
        self.stopped_entry = False
        for raw in self.conn.lrange(self.queue.key, 0, -1):
            self.places[raw.decode()] = "queued"

    def take(self, rng: random.Random) -> None:
        """A worker takes the job at the head of the queue (RQ's ``BLMOVE``)."""
        jid = self.conn.lmove(self.queue.key, intermediate_key("diffq"), "LEFT", "RIGHT")
        if jid is not None:
            self.places[jid.decode()] = "taken"

    def start(self, rng: random.Random) -> None:
        """A worker registers the execution of a job it took; its heartbeat holds."""
        jid = self._pick(rng, "taken")
        if jid is None:
            return
        self.executions += 1
        member = f"{jid}:exec{self.executions}"
        with self.conn.pipeline() as pipe:
            pipe.lrem(intermediate_key("diffq"), 0, jid)
            pipe.zadd(started_registry_key("diffq"), {member: 1e12})  # its heartbeat: far ahead
            pipe.hset(Job.key_for(jid), "status", "started")
            pipe.execute()
        self.members[jid], self.places[jid] = member, "started"

    def kill(self, rng: random.Random) -> None:
        """A running worker dies: its execution's heartbeat lapses."""
        jid = self._pick(rng, "started")
        if jid is not None:
            self.conn.zadd(started_registry_key("diffq"), {self.members[jid]: 1.0})
            self.places[jid] = "killed"

    def write(self, rng: random.Random) -> None:
        """A worker records a job's images: one running, one whose heartbeat lapsed but whose job
        nobody took from it yet (a stall, not a death), or one whose job was taken (recovered,
        cancelled): that one is fenced out by BEGIN/COMMIT and records nothing."""
        if self.stale and rng.random() < 0.3:
            jid, member = self.stale.pop(rng.randrange(len(self.stale)))
            fenced = True
        else:
            jid = self._pick(rng, "started", "killed")
            if jid is None:
                return
            member, fenced = self.members[jid], False
        spec = JobSpec.from_dict(Job.fetch(jid, connection=self.conn, serializer=JSONSerializer).kwargs["spec"])
        keys = [item_key(spec.params, item) for item in spec.items]
        begun = self.ledger.begin(member=member, offset=0, keys=keys)
        counted = self.ledger.commit(member=member, images=dict.fromkeys(keys, 1), recent_member=f"{jid}:1",
                                     output=self.options.output, model=spec.params.model)  # fmt: skip
        if fenced:
            assert begun is None and counted is None  # its job is no longer its own
            return
        with self.conn.pipeline() as pipe:
            pipe.zrem(started_registry_key("diffq"), member)
            pipe.hset(Job.key_for(jid), "status", "finished")
            pipe.execute()
        self.places[jid] = "finished"

    def cancel(self, rng: random.Random) -> None:
        """``producer cancel``: queued, taken and lost jobs cancelled; a running one is asked to
        stop (no worker here acts on it: it stays running)."""
        cancel(self.conn, "diffq", ttl=TTL)
        for jid, place in self.places.items():
            if place == "killed":
                self.stale.append((jid, self.members[jid]))
            if place in ("queued", "taken", "killed"):
                self.places[jid] = "cancelled"

    def recover(self, rng: random.Random) -> None:
        """A worker's recovery (the only live worker): lost and stranded jobs back on the queue."""
        requeue_abandoned(self.queue, stuck_after_s=TTL, me="recoverer")
        for jid, place in self.places.items():
            if place == "killed":
                self.stale.append((jid, self.members[jid]))
            if place in ("killed", "taken"):
                self.places[jid] = "queued"

    def _pick(self, rng: random.Random, *places: str) -> str | None:
        found = sorted(jid for jid, place in self.places.items() if place in places)
        return rng.choice(found) if found else None

    # -- the account ----------------------------------------------------------------------------

    def rows_written(self) -> int:
        return sum(is_done(state) for state in self.conn.hvals(items_key("diffq")))

    def pending(self) -> bool:
        return any(place not in OVER for place in self.places.values())

    def complete(self) -> bool:
        return not self.pending() and not self.stopped_entry and self.rows_written() == ROWS


@pytest.mark.parametrize("seed", range(30))
def test_status_wait_verify_and_metrics_never_disagree_with_each_other_or_with_what_happened(conn, tmp_path, seed):
    rng = random.Random(seed)
    world = World(conn, tmp_path)
    world.enqueue(dies_at=None if rng.random() < 0.5 else rng.randint(1, ROWS - 1))
    moves = [world.take, world.take, world.start, world.start, world.write, world.write, world.write, world.kill,
             world.cancel, world.recover]  # fmt: skip
    for step in range(STEPS):
        if rng.random() < 0.12:
            world.enqueue(dies_at=rng.choice([None, None, rng.randint(1, ROWS - 1)]))  # resume, or die again
        else:
            rng.choice(moves)(rng)
        st = collect(conn, "diffq", stale_after_s=TTL)
        want = world.complete()
        said = {
            "status": st.complete,
            "wait": wait_verdict(st) == 0,
            "verify": not st.not_complete(),
            "metrics": f'diffq_complete{{queue="diffq"}} {1.0 if want else 0.0}'.encode()
            in generate_latest(registry_for(conn, ttl=TTL)),
        }
        context = f"seed {seed} step {step}: places {world.places}, stopped entry {world.stopped_entry}"
        assert said == {"status": want, "wait": want, "verify": want, "metrics": True}, context
        assert (wait_verdict(st) is None) == world.pending(), context  # wait waits exactly while a job is left
        assert st.images_written == world.rows_written(), context  # the count is never ahead of the ledger
