"""Queue status from RQ's registries, plus diffq's counters and recent-completions window.

Every count is O(1) in Redis (list and sorted-set lengths, counters); only running jobs (their
step progress), live workers and a few failures are fetched one by one, so status stays fast
with millions of jobs queued.

Rates come from the jobs that finished in the last :data:`RECENT_WINDOW_S` seconds, over the
time from the start of the earliest of them to now: one finished job already gives a rate, and
several workers finishing in parallel add up. The ETA divides the campaign's images still to
make (queued, minus what running jobs have done of theirs) by the images/s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import redis
from rq.job import Job
from rq.registry import CanceledJobRegistry, FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from common.enqueues import EnqueueRun
from common.heartbeats import beating, seen_workers
from common.lanes import MADE_BY_GROUP, MADE_BY_WORKER, is_group_lane, lanes, made_by_key
from common.queues import (
    RECENT_WINDOW_S,
    by_model_key,
    finished_key,
    get_queue,
    load_failures_key,
    paused_key,
    recent_key,
    scores_key,
)
from common.reconcile import failed_images, is_complete, left
from producer.progress import format_duration

MAX_FAILURES_SHOWN = 5
MAX_RUNNING_SHOWN = 50


@dataclass
class RunningJob:
    job_id: str
    worker: str
    step: int | None = None
    steps: int | None = None
    images: int = 0
    images_done: int = 0
    loading: str | None = None  # "loading model 37%" while the worker loads the job's model
    precision: str | None = None  # fp8 or fp16 (the worker's --precision) once it has denoised
    model: str | None = None  # the job's model (its spec's)

    @property
    def fraction(self) -> float:
        """How far along the job is (steps are most of a job's time)."""
        if self.images_done >= self.images > 0:
            return 1.0
        if self.step and self.steps:
            return self.step / self.steps
        return 0.0

    def text(self) -> str:
        if self.loading:
            return self.loading
        done = f"{self.images_done}/{self.images or '?'} img"
        text = done if self.step is None else f"step {self.step}/{self.steps}, {done}"
        return f"{text}, {self.precision}" if self.precision else text


@dataclass
class Failure:
    job_id: str
    reason: str
    permanent: bool


@dataclass
class QueueStatus:
    queue: str
    queued: int = 0
    running: int = 0
    scheduled: int = 0
    #: taken by a worker, not started yet (RQ's intermediate list)
    starting: int = 0
    #: in no runnable place (their worker died): the next worker to look re-queues them
    lost: int = 0
    #: jobs ``producer cancel`` cancelled (RQ's canceled registry)
    cancelled: int = 0
    #: images of the campaign in no job at all while nothing is pending: items whose job was
    #: stopped, cancelled or deleted (``producer enqueue`` of their file queues them again)
    unaccounted: int = 0
    finished: int = 0
    failed: int = 0
    images_written: int = 0
    #: images of every item ever queued on this queue (the campaign's size)
    images_enqueued: int = 0
    images_per_s: float = 0.0
    jobs_per_s: float = 0.0
    running_jobs: list[RunningJob] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: live workers that take no jobs (or not some), and why: full disk, a model they cannot load
    paused: dict[str, list[str]] = field(default_factory=dict)
    #: the reward scores recorded so far: name -> {n, mean, sd}
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    #: each model's last failed load: model -> {worker, reason, at}
    load_failures: dict[str, dict] = field(default_factory=dict)
    #: the workers were looked at (``collect(details=True)``)
    details: bool = False
    #: of ``queued``, the jobs only a group takes (the group lane, :mod:`common.lanes`)
    for_groups: int = 0
    #: live workers that serve the group lane (xDiT groups' rank 0)
    groups: list[str] = field(default_factory=list)
    #: images written, by who made them: ``worker`` (single-GPU workers) and ``group``
    made_by: dict[str, int] = field(default_factory=dict)
    #: images by model: model -> {"enqueued": n, "written": n} (a campaign of several models)
    by_model: dict[str, dict[str, int]] = field(default_factory=dict)
    #: enqueues of the campaign still reading their file, and those stopped mid-file
    #: (:mod:`common.enqueues`); ``ttl`` tells which is which in words
    enqueuing: list[EnqueueRun] = field(default_factory=list)
    enqueues_stopped: list[EnqueueRun] = field(default_factory=list)
    ttl: float = 30.0

    @property
    def waiting_for_a_group(self) -> bool:
        """Jobs wait in the group lane and no group serves the campaign: they cannot move."""
        return self.details and self.for_groups > 0 and not self.groups

    @property
    def stalled(self) -> str | None:
        """Why no work can move now (no live worker, or every one paused), or None. While so,
        there is no rate and no ETA: the past rate says nothing of when the rest will be done."""
        if not self.details or not self.pending:
            return None
        if not self.workers:
            return "no live worker"
        if self.waiting_for_a_group and self.pending == self.for_groups:
            return f"{self.for_groups} job(s) wait for a group and no group serves this queue"
        if all(name in self.paused for name in self.workers):
            reasons = sorted({reason for name in self.workers for reason in self.paused[name]})
            return "all workers paused: " + "; ".join(reasons)
        return None

    @property
    def pending(self) -> int:
        """Jobs not over (:meth:`common.reconcile.Left.pending`): never 0 while one may still run."""
        return self.queued + self.running + self.scheduled + self.starting + self.lost

    @property
    def settled(self) -> bool:
        """Nothing will change by itself any more (``producer wait`` stops): no job pending, no
        enqueue still reading its file."""
        return not self.pending and not self.enqueuing

    @property
    def complete(self) -> bool:
        """Every image of the campaign is written and nothing is left to queue or run:
        :func:`common.reconcile.is_complete`, the definition wait, verify and the metrics share.
        A cancelled or failed job whose items were made later is no missing image."""
        missing = max(0, self.images_enqueued - self.images_written)
        return is_complete(self.pending, len(self.enqueuing), len(self.enqueues_stopped), missing)

    def not_complete(self) -> list[str]:
        """Why the campaign is not complete, a line each (empty when it is)."""
        lines = [run.describe(self.ttl) for run in (*self.enqueuing, *self.enqueues_stopped)]
        if self.pending:
            lines.append(f"{self.pending} job(s) not over")
        missing = max(0, self.images_enqueued - self.images_written)
        if missing and not self.pending:
            lines.append(f"{missing} image(s) of the campaign not written")
        return lines

    @property
    def images_in_progress(self) -> float:
        """Images' worth of work the running jobs have done (by their step progress)."""
        return sum(r.fraction * r.images for r in self.running_jobs if r.images_done < r.images)

    @property
    def progress(self) -> float | None:
        """How far the campaign is, 0 to 1: images written, plus the running jobs' steps; never
        1 while a job is left. None before anything was enqueued."""
        if not self.images_enqueued:
            return None
        done = min(1.0, (self.images_written + self.images_in_progress) / self.images_enqueued)
        return done if self.complete else min(done, 0.999)

    @property
    def images_left(self) -> float:
        return float(max(0.0, self.images_enqueued - self.images_written - self.images_in_progress))

    @property
    def eta_s(self) -> float | None:
        if not self.pending or self.images_per_s <= 0 or self.stalled or self.enqueuing:
            return None
        return self.images_left / self.images_per_s

    def to_json(self) -> dict[str, object]:
        """Numbers and objects, for scripts (``status --json``)."""
        return {
            "queue": self.queue,
            "jobs": {
                "queued": self.queued,
                "running": self.running,
                "retrying": self.scheduled,
                "starting": self.starting,
                "lost": self.lost,
                "finished": self.finished,
                "failed": self.failed,
                "cancelled": self.cancelled,
                "pending": self.pending,
            },
            "images": {
                "enqueued": self.images_enqueued,
                "written": self.images_written,
                "in_progress": round(self.images_in_progress, 2),
                "progress": None if self.progress is None else round(self.progress, 4),
                "left": round(self.images_left, 2),
                "unaccounted": self.unaccounted,
            },
            "rate": {"images_per_s": round(self.images_per_s, 4), "jobs_per_s": round(self.jobs_per_s, 4)},
            "stalled": self.stalled,
            "complete": self.complete,
            "enqueues": [
                {**run.__dict__, "alive": run in self.enqueuing, "text": run.describe(self.ttl)}
                for run in (*self.enqueuing, *self.enqueues_stopped)
            ],
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "running": [r.__dict__ | {"fraction": round(r.fraction, 3)} for r in self.running_jobs],
            "failures": [f.__dict__ for f in self.failures],
            "workers": self.workers,
            "groups": self.groups,
            "for_groups": self.for_groups,
            "made_by": self.made_by,
            "by_model": self.by_model,
            "paused": self.paused,
            "load_failures": self.load_failures,
            "scores": self.scores,
        }


def score_summary(sums: dict[bytes, bytes]) -> dict[str, dict[str, float]]:
    """Each scorer's count, mean and standard deviation from its running sums."""
    values = {k.decode(): float(v) for k, v in sums.items()}
    summary = {}
    for name in sorted({k.rsplit(":", 1)[0] for k in values}):
        n = values.get(f"{name}:n", 0.0)
        if n <= 0:
            continue
        mean = values.get(f"{name}:sum", 0.0) / n
        var = max(values.get(f"{name}:sumsq", 0.0) / n - mean * mean, 0.0)
        summary[name] = {"n": n, "mean": round(mean, 4), "sd": round(var**0.5, 4)}
    return summary


def by_model(counts: dict[bytes, bytes]) -> dict[str, dict[str, int]]:
    """``<model>:enqueued`` / ``<model>:written`` counters as model -> {enqueued, written}."""
    models: dict[str, dict[str, int]] = {}
    for name, value in counts.items():
        model, _, kind = name.decode().rpartition(":")
        models.setdefault(model, {"enqueued": 0, "written": 0})[kind] = int(value)
    return dict(sorted(models.items()))


def _model_of(job: Job | None) -> str | None:
    try:
        return str(job.kwargs["spec"]["params"]["model"]) if job else None
    except (KeyError, TypeError):
        return None


def failure_reason(job: Job) -> str:
    """One line: what the worker recorded, else the last line of the traceback."""
    reason = job.meta.get("error") if job.meta else None
    if reason:
        return str(reason)
    text = (job.exc_info or "").strip()
    return text.splitlines()[-1] if text else "unknown (no exception recorded)"


def _running(jid: str, job: Job | None) -> RunningJob:
    meta = (job.meta if job else None) or {}
    return RunningJob(
        job_id=jid,
        worker=(job.worker_name if job else None) or "?",
        step=meta.get("step"),
        steps=meta.get("steps"),
        images=int(meta.get("images") or 0),
        images_done=int(meta.get("images_done") or 0),
        loading=meta.get("loading"),
        precision=meta.get("precision"),
        model=_model_of(job),
    )


#: recent jobs read to compute the rates (the rest are counted, not read)
RATE_SAMPLE = 5000


def collect(conn: redis.Redis, queue_name: str, *, details: bool = True, stale_after_s: float = 30) -> QueueStatus:
    """The queue's state. Jobs by place come from :func:`common.reconcile.left`, the one reader
    of RQ's lists (``stale_after_s`` is the heartbeat TTL). ``details``: also the running jobs'
    progress, the live workers (heard from in the last ``stale_after_s`` seconds) and the first
    failures."""
    place = left(conn, queue_name, ttl=stale_after_s)
    status = QueueStatus(queue=queue_name)
    with conn.pipeline(transaction=False) as pipe:
        for lane in lanes(queue_name):
            kw = {"queue": get_queue(lane, conn)}
            pipe.zcard(FinishedJobRegistry(**kw).key)
            pipe.zcard(FailedJobRegistry(**kw).key)
            pipe.zcard(CanceledJobRegistry(**kw).key)
        pipe.get(finished_key(queue_name))
        now = time.time()
        pipe.zcount(recent_key(queue_name), now - RECENT_WINDOW_S, "+inf")
        pipe.zrangebyscore(
            recent_key(queue_name), now - RECENT_WINDOW_S, "+inf", start=0, num=RATE_SAMPLE, withscores=True
        )
        pipe.hgetall(made_by_key(queue_name))
        pipe.hgetall(by_model_key(queue_name))
        *sizes, counted, total, recent, made_by, models = pipe.execute()
    finished, failed, cancelled = (sum(sizes[i::3]) for i in range(3))
    status.made_by = {k.decode(): int(v) for k, v in sorted(made_by.items())}
    status.by_model = by_model(models)
    status.for_groups = place.for_groups
    status.queued, status.running, status.scheduled = place.queued, place.running, place.retrying
    status.starting, status.lost = place.starting, place.lost
    # RQ's registry keeps only the newest finished jobs (worker --keep-finished); the counter has them all
    status.finished, status.failed, status.cancelled = max(finished, int(counted or 0)), failed, cancelled
    status.images_written = place.images_written
    status.images_enqueued = place.images_enqueued
    status.enqueuing, status.enqueues_stopped, status.ttl = place.enqueuing, place.enqueues_stopped, stale_after_s
    if not status.pending and status.images_written < status.images_enqueued:
        missing = status.images_enqueued - status.images_written
        status.unaccounted = max(0, missing - (failed_images(conn, queue_name) if failed else 0))
    status.jobs_per_s, status.images_per_s = rates(recent, now, total)
    if details:
        _fill_details(conn, queue_name, status, stale_after_s, set(place.lost_ids))
        status.details = True
        if status.stalled:  # a rate from workers that are gone or paused would promise an ETA
            status.jobs_per_s = status.images_per_s = 0.0
    return status


def rates(recent: list[tuple[bytes, float]], now: float, total: int | None = None) -> tuple[float, float]:
    """Jobs/s and images/s of the recent window; members are ``<job id>:<images>[:<seconds>]``.

    The span starts when the earliest of those jobs started (its end minus its run time), so a
    single finished job gives a rate, and parallel workers add up. ``recent`` may be the oldest
    :data:`RATE_SAMPLE` of ``total`` members (a fast campaign finishes 10^5 jobs in the window):
    the images are then the sample's mean times ``total``, so status stays O(1) in the campaign."""
    if not recent:
        return 0.0, 0.0
    images = 0
    start = now
    for member, ended in recent:
        parts = member.split(b":")
        images += int(parts[1])
        ran = float(parts[2]) if len(parts) > 2 else 0.0
        start = min(start, ended - ran)
    span = max(now - start, 1.0)
    jobs = max(total or 0, len(recent))
    return jobs / span, images * jobs / len(recent) / span


def _fill_details(
    conn: redis.Redis, queue_name: str, status: QueueStatus, stale_after_s: float, lost: set[str]
) -> None:
    queues = [get_queue(lane, conn) for lane in lanes(queue_name)]
    # cleanup=False everywhere: RQ's clean-up would fail or retry a dead worker's job (status is read-only)
    running = (jid for q in queues for jid in StartedJobRegistry(queue=q).get_job_ids(cleanup=False))
    running_ids = [jid for jid in dict.fromkeys(running) if jid not in lost][:MAX_RUNNING_SHOWN]
    jobs = Job.fetch_many(running_ids, connection=conn, serializer=JSONSerializer)
    status.running_jobs = [_running(jid, job) for jid, job in zip(running_ids, jobs, strict=True)]
    now = time.time()
    live: dict[str, set[str]] = {}
    for q in queues:  # a group serves both lanes, a single worker the first
        for worker in seen_workers(conn, q.name):
            if beating(worker, stale_after_s, now):  # a dead worker's key lingers until its TTL expires
                live.setdefault(worker.name, set()).add(q.name)
    status.workers = sorted(live)
    status.groups = sorted(name for name, served in live.items() if any(is_group_lane(q) for q in served))
    status.scores = score_summary(conn.hgetall(scores_key(queue_name)))
    for model, raw in conn.hgetall(load_failures_key(queue_name)).items():
        status.load_failures[model.decode()] = json.loads(raw)
    for name, raw in conn.hgetall(paused_key(queue_name)).items():
        if name.decode() in status.workers:
            status.paused[name.decode()] = json.loads(raw).get("reasons", [])
    failed_ids = [
        jid for q in queues for jid in FailedJobRegistry(queue=q).get_job_ids(0, MAX_FAILURES_SHOWN - 1, cleanup=False)
    ]
    failed_ids = failed_ids[:MAX_FAILURES_SHOWN]
    for jid, job in zip(
        failed_ids, Job.fetch_many(failed_ids, connection=conn, serializer=JSONSerializer), strict=True
    ):
        reason = failure_reason(job) if job else "job expired"
        status.failures.append(Failure(jid, reason, bool(job and job.meta.get("permanent"))))


def render(status: QueueStatus, redis_label: str) -> str:
    lines = [
        f"queue {status.queue!r} on {redis_label}",
        f"  queued    {status.queued}" + (f" ({status.for_groups} for groups only)" if status.for_groups else ""),
        f"  running   {status.running}",
    ]
    several = len(status.by_model) > 1
    lines += [
        f"    {r.job_id} on {r.worker}: " + (f"{r.model}, " if several and r.model else "") + r.text()
        for r in status.running_jobs
    ]
    if status.starting:
        lines.append(f"  starting  {status.starting} (taken by a worker, not started yet)")
    if status.scheduled:
        lines.append(f"  retrying  {status.scheduled} (waiting for their backoff)")
    if status.lost:
        lines.append(f"  lost      {status.lost} (their worker died; the next worker to start or look re-queues them)")
    lines += [
        f"  finished  {status.finished}",
        f"  failed    {status.failed}",
    ]
    if status.cancelled:
        lines.insert(-1, f"  cancelled {status.cancelled} (producer cancel; the same producer enqueue resumes them)")
    lines += [f"    {f.job_id}: {f.reason}" for f in status.failures]
    if status.failed > len(status.failures):
        lines.append(f"    ... {status.failed - len(status.failures)} more")
    if status.failed:
        lines.append("    (producer retry-failed re-queues the retryable ones; fix the permanent ones first)")
    total = f" of {status.images_enqueued}" if status.images_enqueued else ""
    progress = f" ({100 * status.progress:.1f}% done, running jobs' steps included)" if status.progress else ""
    lines.append(f"  images    {status.images_written}{total} written{'' if status.complete else progress}")
    if len(status.made_by) > 1 or status.made_by.get(MADE_BY_GROUP):
        by = {MADE_BY_WORKER: "single-GPU workers", MADE_BY_GROUP: "groups"}
        kinds = [kind for kind in by if kind in status.made_by] + sorted(set(status.made_by) - set(by))
        made = ", ".join(f"{status.made_by[kind]} by {by.get(kind, kind)}" for kind in kinds)
        lines.append(f"  made      {made}")
    if len(status.by_model) > 1:
        for model, n in status.by_model.items():
            lines.append(f"  model     {model}: {n['written']} of {n['enqueued']} images written")
    if status.waiting_for_a_group:
        lines.append(
            f"  waiting   {status.for_groups} job(s) for a group, and no group serves this queue: start one "
            "(torchrun ... -m worker.group --queue " + status.queue + "); single-GPU workers do not take them"
        )
    lines += [f"  enqueue   {run.describe(status.ttl)}" for run in (*status.enqueuing, *status.enqueues_stopped)]
    if status.unaccounted:
        lines.append(
            f"  missing   {status.unaccounted} image(s) in no job (stopped, cancelled or deleted): "
            "producer enqueue of their prompts file queues them again"
        )
    if status.stalled:
        lines.append(f"  rate      - ({status.stalled})")
    elif status.images_per_s:
        eta = status.eta_s
        eta_text = f", ETA {format_duration(eta)}" if eta is not None else ""
        lines.append(f"  rate      {status.images_per_s:.2f} img/s ({status.jobs_per_s:.3f} jobs/s){eta_text}")
    else:
        lines.append(f"  rate      - (no job finished in the last {RECENT_WINDOW_S // 60} minutes)")
    lines.append(f"  workers   {len(status.workers)}" + (": " + ", ".join(status.workers) if status.workers else ""))
    if status.groups:
        lines.append(f"  groups    {len(status.groups)} of them serve the group lane: " + ", ".join(status.groups))
    for name, reasons in sorted(status.paused.items()):
        lines += [f"  paused    {name}: {reason}" for reason in reasons]
    for name, summary in sorted(status.scores.items()):
        lines.append(
            f"  score     {name}: mean {summary['mean']:.3f} ± {summary['sd']:.3f} over {summary['n']:.0f} img"
        )
    for model, said in sorted(status.load_failures.items()):
        ago = format_duration(time.time() - float(said.get("at", 0)))
        lines.append(f"  model     {model} did not load on {said.get('worker')} ({ago} ago): {said.get('reason')}")
    return "\n".join(lines)


def wait_verdict(st: QueueStatus) -> int | None:
    """What ``producer wait`` does with ``st``: go on waiting (None) while a job is pending or an
    enqueue still reads its file; then exit 0 if the campaign is complete, else 1."""
    if not st.settled:
        return None
    return 0 if st.complete else 1


def wait_words(st: QueueStatus) -> str:
    """What ``producer wait``'s progress line says beside the count: rates, places, what is stalled."""
    parts = [f"{st.jobs_per_s:.3f} jobs/s", f"{st.queued} queued", f"{st.running} running"]
    steps = [r.text() for r in st.running_jobs[:2]]
    if steps:
        parts[-1] += f" ({'; '.join(steps)})"
    if st.starting:
        parts.append(f"{st.starting} starting")
    if st.lost:
        parts.append(f"{st.lost} lost (a worker re-queues them)")
    if st.failed:
        parts.append(f"{st.failed} failed")
    if st.stalled:
        parts.append(st.stalled)
    parts += [f"enqueue {run.where()}" for run in st.enqueuing]
    return "· " + " · ".join(parts)
