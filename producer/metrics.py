"""The fleet's queues for Prometheus: jobs by place, images of each campaign, the rate, live and
paused workers. Read from Redis at each scrape through :func:`producer.status.collect`, the
same reader ``producer status`` uses (and through it :mod:`common.reconcile`), so a scrape and
``producer status`` never disagree.

Served by ``producer metrics`` (a port of its own) and at ``/metrics`` of ``producer dashboard``
(behind its basic auth). Each worker serves its own series (:mod:`worker.serving.metrics`).
"""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from rq import Queue

from common.lanes import MADE_BY_GROUP, MADE_BY_WORKER, campaign_of
from producer.status import collect

#: the keys of campaigns' enqueues in progress (common.enqueues.enqueues_key)
ENQUEUES = "diffq:*:enqueues"
#: the states ``diffq_jobs`` has, in the order ``producer status`` prints them
STATES = ("queued", "starting", "running", "retrying", "lost", "finished", "failed", "cancelled")


class QueueCollector(Collector):
    """Every RQ queue of the Redis, or the ``queues`` named."""

    def __init__(self, conn: redis.Redis, *, ttl: float, queues: list[str] | None = None) -> None:
        self.conn, self.ttl, self.queues = conn, ttl, queues

    def collect(self) -> Iterator[Metric]:
        # a campaign's group lane is its own RQ queue; the campaign is one series. A campaign whose
        # enqueue has queued nothing yet has no RQ queue, only its enqueue's entry: it is listed too
        names = self.queues or sorted(
            {campaign_of(q.name) for q in Queue.all(connection=self.conn)}
            | {
                key.decode()[len("diffq:") : -len(":enqueues")]
                for key in self.conn.scan_iter(match=ENQUEUES, count=1000)
            }
        )
        jobs = GaugeMetricFamily("diffq_jobs", "Jobs by place (as producer status)", labels=["queue", "state"])
        enqueued = _gauge("diffq_images_enqueued", "Images of the campaign (every item ever queued)")
        written = _gauge("diffq_images_written", "Images written and recorded (the ledger's count)")
        missing = _gauge("diffq_images_missing", "Images in no job while none is pending")
        rate = _gauge("diffq_images_per_second", "Images/s over the last 10 minutes")
        workers = _gauge("diffq_workers", "Live workers of the queue")
        paused = _gauge("diffq_workers_paused", "Live workers that take no jobs")
        complete = _gauge("diffq_complete", "1 when every image of the campaign is written")
        for_groups = _gauge("diffq_jobs_for_groups", "Queued jobs only a group takes (the group lane)")
        groups = _gauge("diffq_groups", "Live xDiT groups serving the queue")
        made = GaugeMetricFamily(
            "diffq_images_made", "Images written, by who made them (worker, group)", labels=["queue", "by"]
        )
        scored = GaugeMetricFamily(
            "diffq_images_scored", "Images with a reward score (--score), by scorer", labels=["queue", "score"]
        )
        score_mean = GaugeMetricFamily("diffq_score_mean", "Mean reward score so far", labels=["queue", "score"])
        score_sd = GaugeMetricFamily("diffq_score_sd", "Spread (sd) of the reward score", labels=["queue", "score"])
        for name in names:
            st = collect(self.conn, name, stale_after_s=self.ttl)
            for score, summary in sorted(st.scores.items()):  # what producer status prints as "score"
                scored.add_metric([name, score], summary["n"])
                score_mean.add_metric([name, score], summary["mean"])
                score_sd.add_metric([name, score], summary["sd"])
            counts = {
                "queued": st.queued, "starting": st.starting, "running": st.running, "retrying": st.scheduled,
                "lost": st.lost, "finished": st.finished, "failed": st.failed, "cancelled": st.cancelled,
            }  # fmt: skip
            for state in STATES:
                jobs.add_metric([name, state], counts[state])
            enqueued.add_metric([name], st.images_enqueued)
            written.add_metric([name], st.images_written)
            missing.add_metric([name], st.unaccounted)
            rate.add_metric([name], st.images_per_s)
            workers.add_metric([name], len(st.workers))
            paused.add_metric([name], len(st.paused))
            complete.add_metric([name], 1.0 if st.complete else 0.0)
            for_groups.add_metric([name], st.for_groups)
            groups.add_metric([name], len(st.groups))
            for by in (MADE_BY_WORKER, MADE_BY_GROUP):
                made.add_metric([name, by], st.made_by.get(by, 0))
        yield from (jobs, enqueued, written, missing, rate, workers, paused, complete, for_groups, groups, made)
        yield from (scored, score_mean, score_sd)


def _gauge(name: str, text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, text, labels=["queue"])


def registry_for(conn: redis.Redis, *, ttl: float, queues: list[str] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(QueueCollector(conn, ttl=ttl, queues=queues))
    return registry
