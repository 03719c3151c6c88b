"""The RQ worker class: in-process execution (no fork), heartbeats from a keeper thread, fast
recovery of dead workers' jobs, signals heard at once, and a worker that pauses rather than
fail jobs for its own environment.

RQ's default ``Worker`` forks a work-horse per job: CUDA does not survive ``fork`` and the
child would load the model again for every job. ``SimpleWorker`` runs jobs in-process, but
then nothing refreshes the heartbeats while a long job runs. Each addition has its module:
the keeper's duties (:mod:`~worker.serving.keeper`), the states and the running job's record
(:mod:`~worker.serving.states`), signals (:mod:`~worker.serving.signals`: the first finishes the
job, a second gives it back at the front and exits at once), pauses for a full or read-only
disk (:mod:`~worker.serving.pause`), models it failed to load (:mod:`~worker.serving.breaker`),
and a job's tail written while the next job denoises (:mod:`~worker.serving.overlap`).
docs/architecture.md draws the states and threads and lists every RQ method overridden here.
``--burst`` does not quit while jobs of its queues wait for a retry or run on other workers.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, wait
from contextvars import Token
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import redis
from rq import SimpleWorker
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.utils import now as utcnow
from rq.worker import WorkerStatus
from rq.worker.base import SHUTDOWN_SIGNAL

from common.errors import NeedsAGroup, NotServedHere, OutputUnavailable, WorkerUnavailable
from common.lanes import group_lane
from common.queues import WARM_STOP_REDIS_S, WAY_OUT, get_queue, paused_key, retire_finished
from common.storage import is_url
from worker.output.images import probe_output
from worker.output.objects import probe_store
from worker.serving import context
from worker.serving.affinity import put_held_first
from worker.serving.context import JobContext, Tail
from worker.serving.failures import classify, record_failure
from worker.serving.keeper import Keeper
from worker.serving.overlap import Pending, Writer
from worker.serving.pause import Pause
from worker.serving.recovery import give_back, maintain, requeue_abandoned, unfinished_elsewhere
from worker.serving.runtime import Runtime
from worker.serving.signals import COLD_EXIT_S, EXIT_COLD, EXIT_REDIS_GONE, SignalWatcher
from worker.serving.states import Running, State, States
from worker.serving.task import JobLost, JobStopped
from worker.supervision.lease import GpuLease

log = logging.getLogger("diffq.worker")

#: a worker's own key expires this long after its last heartbeat (RQ default 420 s)
WORKER_TTL_S = 60
DEFAULT_HEARTBEAT_TTL_S = 30
#: longest wait after giving back a job this worker does not take
GIVE_BACK_MAX_WAIT_S = 30.0


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
        self.paused: Pause | None = None
        #: the state (worker/serving/states.py); only the main thread moves it, but for GONE
        self.states = States(self.name)
        #: the running job, its queue and execution (RQ 3 keeps several executions per worker,
        #: the pending one's too), replaced whole by the main thread only: one read is consistent
        self._now: Running | None = None
        self._lost: str | None = None  # id of a running job this worker no longer owns
        self._told: dict[str, int] = {}  # failure causes said, and how often they happened
        self._give_backs = 0  # jobs given back in a row (breaker), to wait between them
        #: the main thread waits for a job (a signal may interrupt it there)
        self._waiting = False
        #: a cold stop is under way: whichever thread ends the process, it ends with EXIT_COLD
        self._cold = False
        #: the background thread of heartbeats, lease, retries, pauses and reaping
        self.keeper = Keeper(self)
        self._signals = SignalWatcher(self._warm_stop, self.stop_now)
        self._scheduler: RQScheduler | None = None
        #: held by the keeper while it renews heartbeats, and while a handed-off job is completed
        #: (not ``_executions``: RQ 3 keeps its list of executions under that name)
        self._executions_lock = threading.RLock()
        #: a job RQ's ``stop-job`` / ``stop-execution`` command asked to stop (pubsub thread)
        self._stop_job: str | None = None
        self._pending: Pending | None = None
        #: the running job's tail, once its job function handed it to the writer
        self._handed: Future[dict[str, Any]] | None = None
        self._writer = Writer() if runtime is not None and runtime.settings.overlap_save else None
        self._context: Token[JobContext | None] | None = None

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
        self.keeper.start()

    def teardown(self) -> None:
        """On the way out every Redis call is bounded (:data:`~common.queues.WAY_OUT`): what
        Redis does not hear of now comes back by the heartbeat, as after a SIGKILL."""
        self.states.move(State.DONE)
        self._finish_pending_on_the_way_out()
        if self._writer is not None:
            self._writer.shutdown()
        self.keeper.stop()
        try:
            self.connection.hdel(paused_key(self.queues[0].name), self.name)
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

    # -- signals ----------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        self._signals.install(self._on_signal_main)

    def _on_signal_main(self, signum: int, frame: FrameType | None) -> None:
        """Main thread, whenever Python gets to it: a worker waiting for a job (or for Redis, or
        for its disk) stops waiting. Anywhere else the exception would cut through bookkeeping
        (RQ's teardown, a job's completion): there the flag alone ends the loop. The watcher
        thread has already done the rest."""
        self._stop_requested = True
        if self._waiting and self._now is None:
            raise StopRequested()

    def _warm_stop(self, signal_name: str) -> None:
        """The first signal: finish the running job, take no other. Redis gets
        :data:`WARM_STOP_REDIS_S` more seconds to answer: past them every call raises instead
        of retrying, the worker exits, and its job comes back by its heartbeat."""
        WAY_OUT.give_up_after(WARM_STOP_REDIS_S)
        self._stop_requested = True
        now = self._now
        doing = f"finishing job {now.job.id}, then exiting" if now is not None else "exiting"
        log.warning("%s: warm shutdown, %s (again for a cold one)", signal_name, doing)

    def stop_now(self, why: str) -> None:
        """A cold stop (a second signal, or the launcher gone): the job goes back at the front of
        its queue and the process ends now, whatever the main thread is in the middle of."""
        now, was = self._now, self.states.now  # one read: the job, its queue and execution together
        self._cold = True
        self.states.move(State.GONE)
        # exit in COLD_EXIT_S whatever happens below: Redis may be down, or hung
        timer = threading.Timer(COLD_EXIT_S, os._exit, (EXIT_COLD,))
        timer.daemon = True
        timer.start()
        WAY_OUT.give_up_after(COLD_EXIT_S / 2)
        owned = now is not None and self._lost != now.job.id
        # said before any Redis call: the timer may end the process while Redis is away
        log.warning("%s (was %s): cold shutdown%s", why, was.value,
                    f"; job {now.job.id} goes back to the front of its queue" if owned else "")  # fmt: skip
        try:
            self.give_back_pending(f"interrupted by a cold shutdown of {self.name} while writing; re-queued")
            if owned:
                reason = f"interrupted by a cold shutdown of {self.name}; re-queued"
                self.give_back(now.job, now.queue, reason, execution=now.execution)
            self.register_death()
            if self.lease is not None:
                self.lease.release()
        except redis.RedisError as exc:
            log.warning("%s: Redis did not answer (%s): the job comes back by its heartbeat",
                        why, exc.__class__.__name__)  # fmt: skip
        finally:
            logging.shutdown()
            os._exit(EXIT_COLD)

    def wait_for_cold_exit(self) -> None:
        """After the work loop: if a cold stop is under way, it ends the process (its thread,
        or its timer within :data:`COLD_EXIT_S`). The main thread must not end it first by
        returning: the interpreter's finalization stops daemon threads, the timer among them,
        and took seconds (exit 0 at 2.2 s measured, the promise is 1.5 s)."""
        if self._cold:
            threading.Event().wait()

    # -- RQ's commands (rq.command.send_command: stop-job, stop-execution, shutdown) -----------

    def get_current_job_id(self) -> str | None:
        """The job this worker denoises now. RQ 3 answers with any of the worker's executions,
        and the one a handed-off job keeps while the writer saves it is one of them; RQ's
        ``stop-job`` command asks this before it stops anything."""
        now = self._now
        return now.job.id if now is not None else None

    def kill_horse(self, sig: signal.Signals = SHUTDOWN_SIGNAL) -> None:
        """RQ's ``stop-job`` and ``stop-execution`` end here (RQ has set ``_stopped_job_id``).
        There is no work-horse to kill: the running job stops at its next denoising step
        (:meth:`_pump`), before any of its images is written; RQ then marks it ``stopped``, not
        failed, and does not retry it. Its items are not done: ``producer enqueue`` of their file
        queues them again."""
        job_id = self._stopped_job_id
        now = self._now
        if now is not None and now.job.id == job_id:
            self._stop_job = job_id
            log.warning("job %s: stop asked for (RQ command); it stops at its next step", job_id)
        else:
            log.warning("job %s: stop asked for, but it is not denoising here (its images may be being "
                        "written); nothing stopped", job_id)  # fmt: skip

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
            hand_off=self._hand_off if self._writer is not None else None,
            between_steps=self._pump,
        )

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._now, self._handed = Running(job, queue), None
        self.states.move(State.RUNNING)
        try:
            super().execute_job(job, queue)
        except redis.RedisError as exc:
            if not WAY_OUT.closed():
                raise
            log.warning("job %s: Redis did not answer on the way out (%s); it comes back by its heartbeat",
                        job.id, exc.__class__.__name__)  # fmt: skip
            raise SystemExit(EXIT_COLD if self._cold else EXIT_REDIS_GONE) from None
        finally:
            self._now = None
            self.states.move(State.WAITING)
            if self._context is not None:
                context.leave(self._context)
                self._context = None
        if self.exit_after_job is not None:
            self._finish_pending_on_the_way_out()
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
            if metrics is not None:
                metrics.job_ended("lost")
            return
        if isinstance(exc, WorkerUnavailable):
            if metrics is not None:
                metrics.job_ended("given_back")
            return
        if isinstance(exc, JobStopped):
            if metrics is not None:
                metrics.job_ended("stopped")
            job.meta["error"] = f"{exc}; producer enqueue of its prompts file queues its items again"
            job.save_meta()
            log.warning("%s", exc)
            return
        failure = classify(exc)
        if metrics is not None:
            metrics.job_ended("failed", kind=type(exc).__name__)
        cause = f"{type(exc).__name__}: {failure.reason}"
        times = self._told[cause] = self._told.get(cause, 0) + 1
        if times == 1 or times in (10, 100, 1000) or times % 10000 == 0:
            again = f" (the same reason {times} times so far)" if times > 1 else ""
            log.error("job %s failed: %s%s", job.id, failure.reason, again)
        log.debug("job %s failed", job.id, exc_info=exc_info)  # rq-dashboard shows it too (exc_info)
        record_failure(job, *exc_info)

    def _execution_of(self, job: Job) -> Execution | None:
        pending = self._pending
        if pending is not None and pending.job.id == job.id:
            return pending.execution
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
            self._unavailable(job, queue, exc, execution)
            return
        self._give_backs = 0
        # the one-line reason first: rq-dashboard shows this text as the job's exception
        reason = job.meta.get("error")
        if reason and exc_string:
            exc_string = f"{reason}\n\n{exc_string}"
        super().handle_job_failure(
            job, queue, started_job_registry=started_job_registry, exc_string=exc_string, execution=execution
        )

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: Any, execution: Execution) -> None:
        handed, self._handed = self._handed, None
        if handed is not None:  # the writer has its tail: completed in finish_pending
            self._pending = Pending(job, queue, started_job_registry, execution, handed)
            return
        self._give_backs = 0
        super().handle_job_success(job, queue, started_job_registry, execution)
        keep = self.runtime.settings.keep_finished if self.runtime else 0
        try:
            retire_finished(self.connection, queue.name, keep)
        except redis.RedisError as exc:  # bookkeeping only: the job is done and recorded
            log.warning("finished jobs of %s not trimmed (%s); the next job trims them", queue.name, exc)

    def _unavailable(self, job: Job, queue: Queue, exc: WorkerUnavailable, execution: Execution | None) -> None:
        if isinstance(exc, NeedsAGroup):  # not this worker's trouble: it goes on
            self.give_back(job, get_queue(group_lane(queue.name), self.connection), str(exc), execution=execution)
            log.info("job %s: %s", job.id, exc)
            return
        if isinstance(exc, NotServedHere):
            self.give_back(job, queue, f"{self.name}: {exc}", execution=execution, at_front=False)  # for others
            self._give_backs += 1
            log.info("job %s given back: %s", job.id, exc)
            return
        self.give_back(job, queue, f"given back by {self.name}: {exc}", execution=execution)
        if isinstance(exc, OutputUnavailable) and exc.output:
            endpoint = self.runtime.settings.s3_endpoint_url if self.runtime else ""
            output, needed = exc.output, exc.needed
            if is_url(output):
                self.pause(str(exc), lambda: probe_store(output, endpoint))
            else:
                self.pause(str(exc), lambda: probe_output(Path(output), needed))

    def pause(self, reason: str, probe: Callable[[], None]) -> None:
        """Take no job until ``probe`` passes; it is tried with backoff while the keeper keeps
        the worker alive. Said once in the log, and kept in Redis for ``producer status``."""
        self.paused = Pause(reason, probe, since=time.time(), next_probe=time.monotonic() + 1.0)
        log.error("paused, jobs stay queued: %s", reason)
        if self.runtime is not None and self.runtime.metrics is not None:
            self.runtime.metrics.paused("output")
        try:
            self.set_state(WorkerStatus.SUSPENDED)
            self.keeper.publish_pauses()
        except redis.RedisError as exc:
            log.warning("the pause is not shown in Redis yet (%s); the keeper tries again", exc.__class__.__name__)

    def _wait_out_pause(self) -> bool:
        """Probe until the pause is over (True), or a stop is asked for (False)."""
        pause = self.paused
        if pause is None:
            return True
        self.states.move(State.PAUSED)
        if not pause.wait_out(lambda: self._stop_requested):
            return False
        self.states.move(State.WAITING)
        self.paused = None
        if self.runtime is not None and self.runtime.metrics is not None:
            self.runtime.metrics.paused(None)
        try:
            self.keeper.publish_pauses()
        except redis.RedisError as exc:
            log.warning("the end of the pause is not shown in Redis yet (%s); the keeper tries again",
                        exc.__class__.__name__)  # fmt: skip
        return True

    # -- overlap: a job's tail on the writer while the next one runs ---------------------------

    def _hand_off(self, tail: Tail) -> dict[str, Any]:
        """Called by the job function once its images are made: at most one tail in the writer.
        Returns the dict the tail fills, which the job function returns as its result."""
        self.finish_pending()
        assert self._writer is not None
        result, self._handed = self._writer.submit(tail)
        return result

    def _pump(self) -> None:
        """Between two denoising steps: stop the job if RQ's ``stop-job`` asked for it, and
        complete the previous job if its tail is done. A Redis error here must not fail the
        running job: the previous one keeps its record, and if RQ never hears of it, its
        execution lapses and the re-run finds every item done."""
        now = self._now
        if self._stop_job is not None and now is not None and now.job.id == self._stop_job:
            self._stop_job = None
            raise JobStopped(f"job {now.job.id} stopped on request (RQ stop-job); no image of it was written")
        if self._pending is None or not self._pending.future.done():
            return
        try:
            self.finish_pending()
        except redis.RedisError as exc:
            log.warning("could not complete the previous job in RQ (%s); it is re-queued and skipped", exc)

    def _finish_pending_on_the_way_out(self) -> None:
        """:meth:`finish_pending`, with a Redis that does not answer said, not raised: the job
        comes back by its heartbeat."""
        try:
            self.finish_pending()
        except redis.RedisError as exc:
            log.warning("the job in the writer was not completed in RQ (%s); it comes back by its heartbeat",
                        exc.__class__.__name__)  # fmt: skip

    def finish_pending(self) -> None:
        """Wait for the writer, then complete the handed-off job in RQ as ``perform_job`` would
        have: success, or the failure path (a full disk gives it back and pauses the worker; a
        lost job records nothing)."""
        pending = self._pending
        if pending is None:
            return
        wait([pending.future])  # the keeper heartbeats the job meanwhile
        with self._executions_lock:  # self._pending stays set meanwhile: its job's execution is asked for
            job, queue, registry, execution = pending.job, pending.queue, pending.registry, pending.execution
            try:
                pending.future.result()  # the job's result is the dict it filled
            except Exception:  # handle_job_failure reads the exception from sys.exc_info()
                exc_info = sys.exc_info()
                exc_string = "".join(traceback.format_exception(*exc_info))
                self.handle_exception(job, *exc_info)
                self.handle_job_failure(job, queue, registry, exc_string, execution=execution)
            else:
                self.handle_job_success(job, queue, registry, execution)
            finally:
                self._pending = None

    def give_back_pending(self, reason: str) -> None:
        """A cold stop: the job in the writer goes back to the front of its queue. Whatever the
        writer records after this is fenced out; the files it finished are kept by the retry."""
        held = self._executions_lock.acquire(timeout=COLD_EXIT_S / 4)  # not while the main thread completes it
        try:
            pending, self._pending = self._pending, None
        finally:
            if held:
                self._executions_lock.release()
        if pending is not None and self._lost != pending.job.id:
            self.give_back(pending.job, pending.queue, reason, execution=pending.execution)

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
        if self._pending is not None:
            if not (self._stop_requested or self.paused or self._give_backs):
                result = super().dequeue_job_and_maintain_ttl(None)  # a job waiting: take it now
                if result is not None:
                    return result
            self.finish_pending()  # nothing to overlap with: complete the last job first
        said = ""
        while True:
            if self._stop_requested or not self._wait_out_pause():
                return None
            if self._give_backs and not self._after_give_back(burst=timeout is None):
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

    def _after_give_back(self, burst: bool) -> bool:
        """After giving jobs back in a row: wait longer each time (the queue may hold nothing
        else); a burst worker that went round the whole queue stops (False)."""
        if burst and self._give_backs > sum(q.count for q in self.queues):
            log.warning("burst: the queue holds only jobs this worker does not take; exiting")
            return False
        deadline = time.monotonic() + min(0.5 * 2 ** (self._give_backs - 1), GIVE_BACK_MAX_WAIT_S)
        while time.monotonic() < deadline and not self._stop_requested:
            time.sleep(0.2)
        return not self._stop_requested
