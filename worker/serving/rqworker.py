"""The RQ worker class: in-process execution (no fork), heartbeats from a keeper thread, fast
recovery of dead workers' jobs, signals heard at once, and a worker that pauses rather than
fail jobs for its own environment.

RQ's default ``Worker`` forks a work-horse per job: CUDA does not survive ``fork`` and the
child would load the model again for every job. ``SimpleWorker`` runs jobs in-process, but
then nothing refreshes the heartbeats while a long job runs. Each addition is a part
(:mod:`~worker.serving.parts`: a start, a stop, an order declared in :meth:`DiffqWorker.__init__`)
in its own module: stopping on signals (:mod:`~worker.serving.signals`: the first finishes the
job, a second gives it back at the front and exits at once), pauses for a full or read-only
disk (:mod:`~worker.serving.pause`), jobs given back for the worker's own reasons
(:mod:`~worker.serving.give_backs`), the keeper's duties (:mod:`~worker.serving.keeper`) and a
job's tail written while the next job denoises (:mod:`~worker.serving.overlap`). This class is
the RQ side: the states and the running job's record (:mod:`~worker.serving.states`), and the
RQ methods it overrides, each calling the parts; docs/architecture.md draws the states and
threads and lists every override.
``--burst`` does not quit while jobs of its queues wait for a retry or run on other workers.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from contextvars import Token
from dataclasses import replace
from typing import Any

import redis
from rq import SimpleWorker
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.utils import now as utcnow
from rq.worker.base import SHUTDOWN_SIGNAL

from common.errors import WorkerUnavailable
from common.queues import WAY_OUT, retire_finished
from worker.serving import commands, context
from worker.serving.affinity import put_held_first
from worker.serving.context import JobContext
from worker.serving.failures import FailureLog, classify, record_failure
from worker.serving.give_backs import GiveBacks
from worker.serving.keeper import Keeper
from worker.serving.overlap import Tails
from worker.serving.parts import Parts
from worker.serving.pause import Pauses
from worker.serving.recovery import give_back, maintain, requeue_abandoned, unfinished_elsewhere
from worker.serving.runtime import Runtime
from worker.serving.signals import EXIT_COLD, EXIT_REDIS_GONE, Stops
from worker.serving.states import Running, State, States
from worker.serving.task import JobLost, JobStopped
from worker.supervision.lease import GpuLease

log = logging.getLogger("diffq.worker")

#: a worker's own key expires this long after its last heartbeat (RQ default 420 s)
WORKER_TTL_S = 60
DEFAULT_HEARTBEAT_TTL_S = 30


class DiffqWorker(SimpleWorker):
    serializer = JSONSerializer

    def __init__(
        self,
        *args: Any,
        lease: GpuLease | None = None,
        runtime: Runtime | None = None,
        heartbeat_ttl: int = DEFAULT_HEARTBEAT_TTL_S,
        **kwargs: Any,
    ) -> None:
        self.heartbeat_ttl = heartbeat_ttl
        self.keepalive_s = heartbeat_ttl / 6
        self.reap_s = heartbeat_ttl / 3
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("worker_ttl", max(WORKER_TTL_S, 2 * heartbeat_ttl))
        kwargs.setdefault("job_monitoring_interval", max(1, int(self.keepalive_s)))
        super().__init__(*args, **kwargs)
        self.lease = lease
        self.lease_lost = False
        self.runtime = runtime
        #: set by a subclass to end the work loop with this exit status after the current job
        self.exit_after_job: int | None = None
        #: the state (worker/serving/states.py); only the main thread moves it, but for GONE
        self.states = States(self.name)
        #: the running job, its queue and execution (RQ 3 keeps several executions per worker,
        #: the pending one's too), replaced whole by the main thread only: one read is consistent
        self._now: Running | None = None
        self._lost: str | None = None  # id of a running job this worker no longer owns
        self.failure_log = FailureLog()
        #: the main thread waits for a job (a signal may interrupt it there)
        self._waiting = False
        self._scheduler: RQScheduler | None = None
        #: held by the keeper while it renews heartbeats, and while a handed-off job is completed
        #: (not ``_executions``: RQ 3 keeps its list of executions under that name)
        self._executions_lock = threading.RLock()
        #: a job RQ's ``stop-job`` / ``stop-execution`` command asked to stop (pubsub thread)
        self._stop_job: str | None = None
        self._context: Token[JobContext | None] | None = None
        # the parts (worker/serving/parts.py), started in this order at boot, stopped in reverse
        self.stops = Stops(self)
        self.pauses = Pauses(self)
        self.give_backs = GiveBacks(self)
        #: the background thread of heartbeats, lease, retries, pauses and reaping
        self.keeper = Keeper(self)
        self.tails = Tails(self, self._executions_lock, overlap=runtime is not None and runtime.settings.overlap_save)
        self.parts = Parts(self.stops, self.pauses, self.give_backs, self.keeper, self.tails)

    # -- heartbeats and recovery ------------------------------------------------------------

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        """Short, so a dead worker's job is noticed in seconds; the keeper renews it. RQ's own
        ``maintain_heartbeats`` renews the execution only while it is still in the started
        registry (``XX``): a worker back from a stall cannot take back a job given away."""
        return self.heartbeat_ttl

    def prepare_execution(self, job: Job) -> Execution:
        """Remembers the running job's execution (RQ 3 keeps a worker's executions in a dict,
        and a handed-off job's stays there while the next one runs), and gives the job its
        context: it names this execution. :meth:`execute_job` takes the context away."""
        execution = super().prepare_execution(job)
        if self._now is not None and self._now.job is job:
            self._now = replace(self._now, execution=execution)
        if self.runtime is not None:
            self._context = context.enter(self.job_context())
        return execution

    def owns(self, job: Job, execution: Execution | None) -> bool:
        """Is this worker's ``execution`` of ``job`` still the one in the started registry?"""
        if execution is None:
            return False
        return self.connection.zscore(job.started_job_registry.key, execution.composite_key) is not None

    def bootstrap(
        self,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        super().bootstrap(logging_level, date_format, log_format)
        self.log.setLevel(logging.WARNING)  # RQ says four things per job; the job function says one
        self._scheduler = RQScheduler(self.queues, connection=self.connection, serializer=self.serializer)
        self._scheduler.log.setLevel(logging.WARNING)  # it logs every lock it takes, every few seconds
        self.parts.start()

    def teardown(self) -> None:
        """On the way out every Redis call is bounded (:data:`~common.queues.WAY_OUT`): what
        Redis does not hear of now comes back by the heartbeat, as after a SIGKILL."""
        self.states.move(State.DONE)
        self.parts.stop()
        try:
            super().teardown()
        except redis.RedisError as exc:
            log.warning("Redis did not answer on the way out (%s); this worker's key expires by itself", exc)

    def keep_more(self) -> None:
        """More keeper work for subclasses (an xDiT group's rank 0 watches its peers here)."""

    def clean_registries(self) -> None:
        """At start and between jobs (the main thread holds no job in RQ's intermediate list
        then): what is lost goes back to the queue, at once where no other worker is alive;
        then RQ's maintenance of the other registries, never its clean-up of started jobs
        (:func:`worker.serving.recovery.maintain`)."""
        for queue in self.queues:
            requeue_abandoned(queue, stuck_after_s=self.heartbeat_ttl, me=self.name)
            maintain(queue)
        self.last_cleaned_at = utcnow()

    def _install_signal_handlers(self) -> None:
        """Nothing here: the stops part installed diffq's handlers at boot (RQ calls this right
        after), since RQ's raise in the main thread, which may sit in a CUDA call for seconds."""

    def subscribe(self) -> None:
        """RQ's, on a thread a stop waits for briefly (:mod:`~worker.serving.commands`)."""
        self.pubsub, self.pubsub_thread = commands.listen(self)

    def unsubscribe(self) -> None:
        if self.pubsub_thread is not None:
            commands.stop_listening(self.pubsub, self.pubsub_thread)

    # -- RQ's commands (rq.command.send_command: stop-job, stop-execution, shutdown) -----------

    def get_current_job_id(self) -> str | None:
        """The job this worker denoises now. RQ 3 answers with any of the worker's executions,
        and the one a handed-off job keeps while the writer saves it is one of them; RQ's
        ``stop-job`` command asks this before it stops anything."""
        now = self._now
        return now.job.id if now is not None else None

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        """RQ's ``stop-job`` and ``stop-execution`` end here: no horse, the job stops at its next
        step (:func:`worker.serving.commands.stop_job`)."""
        commands.stop_job(self, self._stopped_job_id)

    # -- jobs and their failures ------------------------------------------------------------

    def stop_after_job(self) -> None:
        """Take no new job: the work loop ends once the current one is done (or now, if idle)."""
        self._stop_requested = True

    @property
    def running(self) -> tuple[Job | None, Queue | None]:
        """The job this worker runs now, and its queue (both None between jobs)."""
        now = self._now
        return (now.job, now.queue) if now is not None else (None, None)

    def give_back(
        self, job: Job, queue: Queue, reason: str, *, execution: Execution | None = None, at_front: bool = True
    ) -> None:
        """End this worker's execution of ``job`` (the running one unless told) and put the job
        back, retries untouched."""
        with self.connection.pipeline() as pipe:
            self.cleanup_execution(job, pipeline=pipe, execution=execution or self._execution_of(job))
            pipe.execute()
        give_back(queue, job, reason, at_front=at_front)

    def job_context(self) -> JobContext:
        """What the running job gets from this worker (see :mod:`worker.serving.context`)."""
        now = self._now
        assert self.runtime is not None and now is not None and now.execution is not None
        return JobContext(
            self.runtime,
            execution=now.execution.composite_key,
            hand_off=self.tails.hand_off if self.tails.writer is not None else None,
            between_steps=self._pump,
        )

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._now, self.tails.handed = Running(job, queue), None
        self.states.move(State.RUNNING)
        try:
            super().execute_job(job, queue)
        except redis.RedisError as exc:
            if not WAY_OUT.closed():
                raise
            log.warning("job %s: Redis did not answer on the way out (%s); it comes back by its heartbeat",
                        job.id, exc.__class__.__name__)  # fmt: skip
            raise SystemExit(EXIT_COLD if self.stops.cold_under_way else EXIT_REDIS_GONE) from None
        finally:
            self._now = None
            self.states.move(State.WAITING)
            if self._context is not None:
                context.leave(self._context)
                self._context = None
        if self.exit_after_job is not None:
            self.tails.finish_on_the_way_out()
            raise SystemExit(self.exit_after_job)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """One line per failure in the log (the traceback at DEBUG; a repeated reason is counted,
        not repeated), then the failure handlers. Nothing at all for a job this worker lost or
        could not run here."""
        exc = exc_info[1]
        if isinstance(exc, redis.RedisError) and WAY_OUT.closed():
            raise exc  # stopping with Redis gone: nothing to record (execute_job says so)
        metrics = self.runtime.metrics if self.runtime is not None else None
        if isinstance(exc, JobLost) or not self.owns(job, self._execution_of(job)):
            self._lost = job.id
            outcome = "lost"
        elif isinstance(exc, WorkerUnavailable):
            outcome = "given_back"
        elif isinstance(exc, JobStopped):
            outcome = "stopped"
            job.meta["error"] = f"{exc}; producer enqueue of its prompts file queues its items again"
            job.save_meta()
            log.warning("%s", exc)
        else:
            outcome = "failed"
        if metrics is not None:
            metrics.job_ended(outcome, kind=type(exc).__name__ if outcome == "failed" else None)
        if outcome != "failed":
            return
        self.failure_log.say(job.id, exc, classify(exc))
        log.debug("job %s failed", job.id, exc_info=exc_info)  # rq-dashboard shows it too (exc_info)
        record_failure(job, *exc_info)

    def _execution_of(self, job: Job) -> Execution | None:
        pending = self.tails.execution_of(job)
        if pending is not None:
            return pending
        now = self._now
        return now.execution if now is not None and now.job.id == job.id else None

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any = None,
        exc_string: str = "",
        execution: Execution | None = None,
    ) -> None:
        exc = sys.exc_info()[1]  # RQ calls this inside its ``except`` block
        if self._lost == job.id:
            log.warning("job %s belongs to another worker now; recorded nothing", job.id)
            with self.connection.pipeline() as pipe:
                self.cleanup_execution(job, pipeline=pipe, execution=execution)
                pipe.execute()
            return
        if isinstance(exc, WorkerUnavailable):
            self.give_backs.unavailable(job, queue, exc, execution)
            return
        self.give_backs.in_a_row = 0
        # the one-line reason first: rq-dashboard shows this text as the job's exception
        reason = job.meta.get("error")
        if reason and exc_string:
            exc_string = f"{reason}\n\n{exc_string}"
        super().handle_job_failure(
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string, execution=execution
        )

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: Any, execution: Execution) -> None:
        if self.tails.keep(job, queue, started_job_registry, execution):  # completed when the writer is done
            return
        self.give_backs.in_a_row = 0
        super().handle_job_success(job, queue, started_job_registry, execution)
        keep = self.runtime.settings.keep_finished if self.runtime else 0
        try:
            retire_finished(self.connection, queue.name, keep)
        except redis.RedisError as exc:  # bookkeeping only: the job is done and recorded
            log.warning("finished jobs of %s not trimmed (%s); the next job trims them", queue.name, exc)

    # -- between a job's steps -------------------------------------------------------------

    def _pump(self) -> None:
        """Between two denoising steps: stop the job if RQ's ``stop-job`` asked for it, and
        complete the previous job if its tail is done. A Redis error here must not fail the
        running job: the previous one keeps its record, and if RQ never hears of it, its
        execution lapses and the re-run finds every item done."""
        now = self._now
        if self._stop_job is not None and now is not None and now.job.id == self._stop_job:
            self._stop_job = None
            raise JobStopped(f"job {now.job.id} stopped on request (RQ stop-job); no image of it was written")
        if not self.tails.ready():
            return
        try:
            self.tails.finish()
        except redis.RedisError as exc:
            log.warning("could not complete the previous job in RQ (%s); it is re-queued and skipped", exc)

    # -- waiting for work -------------------------------------------------------------------

    #: an idle worker waits for a job in slices of this many seconds, so a stop another thread
    #: asks for (the keeper, when the GPU lease was taken over) ends it within one slice: RQ's
    #: own wait returns only with a job; a group's rank 0 pings its ranks between slices
    idle_every_s: int = 5

    def idle(self) -> None:
        """Called about every :attr:`idle_every_s` (and every burst wait) while no job runs."""

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self._waiting = True
        self.states.move(State.WAITING)
        try:
            return self._dequeue(timeout, max_idle_time)
        finally:
            self._waiting = False

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> Any:
        put_held_first(self.connection, self.queues, self.runtime)  # worker/serving/affinity.py
        if self.tails.pending is not None:
            if not (self._stop_requested or self.pauses.now or self.give_backs.in_a_row):
                result = super().dequeue_job_and_maintain_ttl(None)  # a job waiting: take it now
                if result is not None:
                    return result
            self.tails.finish()  # nothing to overlap with: complete the last job first
        said = ""
        while True:
            if self._stop_requested or not self.pauses.wait_out(lambda: self._stop_requested):
                return None
            if self.give_backs.in_a_row and not self.give_backs.wait_after(burst=timeout is None):
                return None
            put_held_first(self.connection, self.queues, self.runtime)
            if timeout is not None:
                # wait for a job in slices, with idle() between them
                result = super().dequeue_job_and_maintain_ttl(self.idle_every_s, self.idle_every_s)
                if result is not None:
                    return result
                self.idle()
                continue
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if result is not None or timeout is not None or self._stop_requested:
                return result
            wait, why = unfinished_elsewhere(self.queues, ttl=self.heartbeat_ttl, me=self.name, poll_s=self.keepalive_s)
            if wait is None:
                return None
            if why != said:
                log.info("burst: queue is empty but %s; waiting", why)
                said = why
            time.sleep(min(max(wait, 0.2), self.keepalive_s))
            self.keeper.move_due_retries()
            self.idle()
