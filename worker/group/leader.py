"""Rank 0: the only rank that talks to Redis.

It is an ordinary diffq RQ worker (heartbeats from the keeper thread, the job in the started
registry, one worker in rq-dashboard) whose pipelines object spreads each batch over the
group: the job function (:mod:`worker.task`) is the single-GPU one, so names, PNG metadata,
``metadata.jsonl`` and the Redis bookkeeping are the same code, not a copy.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict
from typing import Any

import redis
from PIL import Image
from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue

from common.errors import DiffqError, ModelLoadError, NotServedHere, PermanentJobError
from common.lanes import is_group_lane
from common.processes import alive
from worker.group.comm import EXIT_GROUP_LOST, PING_INTERVAL_S, Answer, Command, Control, GroupLost
from worker.group.engine import RankEngine
from worker.pipelines.backend import Batch
from worker.pipelines.pixels import BatchResult
from worker.pipelines.warm import LoadedPipeline
from worker.serving.recovery import put_back_taken
from worker.serving.rqworker import DiffqWorker

log = logging.getLogger("diffq.group")

#: seconds a peer must have been dead before the keeper gives up on a stuck main thread
PEER_GRACE_S = 10.0


def _model_of(job: Job) -> str | None:
    """The model a diffq job asks for, or None (not a diffq job: the task says what is wrong)."""
    try:
        return str(job.kwargs["spec"]["params"]["model"])
    except (KeyError, TypeError):
        return None


class RankFailed(DiffqError):
    """A rank's part of a batch raised; retried like any transient failure."""


class RankFailedPermanently(PermanentJobError):
    """A rank's part of a batch can never succeed (missing adapter, OOM at one image...)."""


class GroupPipelines:
    """Rank 0's :class:`~worker.pipelines.backend.GenerationBackend`: ``generate`` is one round
    of the protocol (broadcast the work, every rank runs its part, answers gathered at rank 0)."""

    def __init__(self, engine: RankEngine, control: Control) -> None:
        self.engine = engine
        self.control = control
        self.device = engine.pipelines.device
        self.dtype = engine.pipelines.dtype
        self.speedups = engine.pipelines.speedups
        self.lost = False  # a peer is gone: the job goes back to the queue and the group exits
        self.stop_asked = False  # some rank got SIGTERM

    def get(self, model: str, on_progress: Any = None) -> tuple[LoadedPipeline, float]:
        """The group's one model (loaded by every rank at start-up)."""
        if model != self.engine.model:
            raise ModelLoadError(
                f"this xDiT group serves {self.engine.model!r} and the job asks for {model!r}: "
                "send it to a queue whose workers load that model"
            )
        assert self.engine.loaded is not None
        return self.engine.loaded, 0.0

    def use_adapters(self, loaded: LoadedPipeline, stack: tuple[tuple[str, float], ...]) -> None:
        """Nothing here: the adapters travel with the batch and every rank switches to them."""

    def use_decoder(self, loaded: LoadedPipeline, name: str | None) -> None:
        """A group decodes with the model's VAE (split over its ranks): a job that asks for a
        preview decoder is given back for single-GPU workers, retries untouched."""
        if name is not None:
            raise NotServedHere(f"this group does not run preview decoders (--decoder {name}); given back")

    def generate(
        self,
        loaded: LoadedPipeline,
        batch: Batch,
        on_step: Any = None,
        on_progress: Any = None,  # the group compiles nothing at run time: nothing to report
    ) -> tuple[BatchResult, int]:
        prompts, max_batch = batch.prompts, batch.max_batch
        work = {
            "params": asdict(batch.params),
            "prompts": prompts,
            "negatives": batch.negatives,
            "seeds": batch.seeds,
            "max_batch": max_batch,
        }
        answers = self._round(Command("batch", work), lambda: self.engine.run(work, on_step))
        failed = [a for a in answers if a.error]
        if failed:
            reasons = "; ".join(a.error or "" for a in failed)
            if all(a.permanent for a in failed):
                raise RankFailedPermanently(reasons)
            raise RankFailed(reasons)
        images: list[Image.Image] = []
        for dp_rank in range(self.engine.layout.data_parallel_degree):
            part = next((a.images for a in answers if a.dp_rank == dp_rank and a.images is not None), None)
            if part is None:
                raise RankFailed(f"no rank returned the images of data-parallel rank {dp_rank}")
            images += part
        if len(images) != len(prompts):
            raise RankFailed(f"the group returned {len(images)} image(s) for {len(prompts)} prompt(s)")

        # the slowest rank sets the pace (under xDiT the holder also decodes): report its times
        def slowest(key: str) -> float:
            return max((a.timings.get(key, 0.0) for a in answers), default=0.0)

        return BatchResult(images, slowest("encode_s"), slowest("denoise_s"), slowest("decode_s")), max_batch

    def ping(self) -> None:
        """While idle: prove every rank is alive, and learn whether one was asked to stop."""
        self._round(Command("ping"), lambda: Answer(rank=0))

    def stop(self, exit_code: int) -> None:
        if not self.lost:
            try:
                self.control.broadcast(Command("stop", exit_code=exit_code))
            except GroupLost as exc:  # the ranks that are left end with the group's rendezvous
                log.warning("stop not told to every rank: %s", exc)

    def _round(self, command: Command, mine: Any) -> list[Answer]:
        try:
            self.control.broadcast(command)
            answers = self.control.gather(mine())
        except GroupLost:
            self.lost = True
            raise
        if any(a.stop for a in answers) and not self.stop_asked:
            self.stop_asked = True
            ranks = ",".join(str(a.rank) for a in answers if a.stop)
            log.warning("rank(s) %s asked to stop: the group stops after this job", ranks)
        return answers


class GroupWorker(DiffqWorker):
    """The RQ worker of rank 0; the keeper thread keeps heartbeats while the group computes.

    The keeper also watches the other ranks' processes. On NCCL, rank 0 can sit in a CUDA wait
    for a peer that is gone and never reach Python again: it neither sees the error nor runs its
    SIGTERM handler, until torchrun SIGKILLs it 30 s later and the job waits for its heartbeat to
    expire. So when a peer has been dead for :data:`PEER_GRACE_S` and the main thread has not
    noticed, the keeper puts the job back at the front of the queue and ends the process.
    """

    def __init__(self, *args: Any, group: GroupPipelines, peers: list[int] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group
        self.peers = peers or []
        self._dead_since: float | None = None

    def keep_more(self) -> None:
        dead = [pid for pid in self.peers if not alive(pid)]
        if not dead or self.group.lost:
            return
        if self._dead_since is None:
            self._dead_since = time.monotonic()
        if time.monotonic() - self._dead_since < PEER_GRACE_S:
            return  # the main thread usually notices first, through its own collective
        job, queue = self.running
        if job is not None and queue is not None:
            self.group.lost = True
            self.give_back(
                job, queue, f"the xDiT group {self.name} lost a rank (pid {dead[0]}) during this job; re-queued"
            )
        log.error(
            "rank process(es) %s died and the main thread is stuck; %s, exiting",
            ",".join(map(str, dead)),
            f"job {job.id} re-queued" if job is not None else "no job was running",
        )
        try:
            self.tails.give_back(f"the xDiT group {self.name} lost a rank while writing this job; re-queued",
                                 lost=self._lost)  # fmt: skip
            self.register_death()
        except redis.RedisError as exc:
            log.warning("Redis did not answer on the way out (%s): the job in the writer comes back by its "
                        "heartbeat", exc.__class__.__name__)  # fmt: skip
        os._exit(EXIT_GROUP_LOST)

    idle_every_s = int(PING_INTERVAL_S)

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        if self.group.stop_asked:  # a rank got SIGTERM during the last job
            self.stop_after_job()
        while True:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            if result is None:
                return None
            job, queue = result
            model = _model_of(job)
            if is_group_lane(queue.name) or model is None or model == self.group.engine.model:
                return result
            # the campaign's own queue holds another model's jobs: the single workers' work, not
            # a failure; from now on this group serves its own lane only
            put_back_taken(queue, job.id)
            self.queues = self._ordered_queues = [q for q in self.queues if is_group_lane(q.name)]
            log.warning(
                "queue %r holds jobs for %s and this group serves %s: job %s put back for single-GPU workers; "
                "the group takes only its lane %r from now on",
                queue.name, model, self.group.engine.model, job.id, self.queues[0].name if self.queues else "-",
            )  # fmt: skip

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ takes a job out of its lane's intermediate list only for a worker of one queue (it
        pops several with BLPOP, which skips that list); a group takes each lane with LMOVE
        (:class:`common.lanes.LaneQueue`), so the job leaves the list here, as it starts."""
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    def idle(self) -> None:
        """Ping every rank: a dead or stuck one is found while the queue is empty, too."""
        try:
            self.group.ping()
        except GroupLost as exc:
            log.error("%s; the group exits", exc)
            raise SystemExit(EXIT_GROUP_LOST) from None
        if self.group.stop_asked:
            self.stop_after_job()

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any = None,
        exc_string: str = "",
        execution: Execution | None = None,
    ) -> None:
        if self.group.lost:
            # not the job's fault: back to the front of the queue, retries untouched
            reason = f"the xDiT group {self.name} lost a rank during this job; re-queued"
            self.give_back(job, queue, reason, execution=execution)
            log.error("a rank left the group during job %s; re-queued, exiting", job.id)
            self.exit_after_job = EXIT_GROUP_LOST
            return
        super().handle_job_failure(job, queue, started_job_registry, exc_string, execution=execution)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        if self.group.lost or isinstance(exc_info[1], GroupLost):
            return
        super().handle_exception(job, *exc_info)
