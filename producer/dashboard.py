"""``producer dashboard``: rq-dashboard, configured for diffq's queues and safe by default.

rq-dashboard 0.9.0's ``--json`` makes it read queues and jobs with RQ's JSON serializer, but its
Workers page builds workers with ``Worker.all()`` and no serializer, so a worker's current job is
read with pickle: the page answers HTTP 500 (``DeserializationError``) whenever a job runs, which
is always during a campaign. It has no setting for that, so this launcher gives its web module a
``Worker`` whose serializer defaults to JSON, then runs rq-dashboard's own command with:
``--json``; ``127.0.0.1`` unless ``--bind`` says otherwise; basic auth, required (it refuses to
start without a password); the delete and empty buttons off unless ``--allow-delete``.

Three more things rq-dashboard shows as a programmer would, and a user reads here instead:
the Workers page names a running job by its call string (``worker.task.run_job(spec={'v': 1,
…``), so it gets the job's description with its progress; a job's page shows its progress
only inside the raw JSON of its metadata, so the description carries it in words; and a job
that failed for good (``permanent``: requeuing it would fail the same way) is not offered the
Requeue button (its status reads ``failed (permanent)``).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer

from common.heartbeats import SeenWorker


class JSONWorker(SeenWorker):
    """``rq.Worker`` read back with the JSON serializer unless told otherwise, and read only:
    RQ's ``get_current_executions`` (which ``get_current_job`` calls) removes the executions that
    expired from the worker's set, and its ``Worker.all`` removes an expired worker from
    ``rq:workers`` (``SeenWorker`` only leaves it out), so the Workers page of a dead worker
    changed Redis."""

    def __init__(self, *args: Any, serializer: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, serializer=serializer or JSONSerializer, **kwargs)

    def get_current_executions(self, refresh: bool = False) -> list[Execution]:
        keys = [member.decode() for member in self.connection.smembers(self.executions_key)]
        executions = [Execution.from_composite_key(key, connection=self.connection) for key in keys]
        with self.connection.pipeline(transaction=False) as pipe:
            for execution in executions:
                pipe.hgetall(execution.key)
            found = pipe.execute()
        live = []
        for execution, data in zip(executions, found, strict=True):
            if data:  # an expired one is left out here; the workers' own maintenance removes it
                execution.restore(data)
                live.append(execution)
        return live


class ReadOnlyQueue(Queue):
    """``rq.Queue`` for the dashboard's pages: looking at a job changes nothing. RQ's
    ``fetch_job`` removes an id whose job is gone from the queue's list, so a page view would
    change the queue; here such a job is only left out (producer status is read-only the same way)."""

    def fetch_job(self, job_id: str) -> Job | None:
        try:
            job = self.job_class.fetch(job_id, connection=self.connection, serializer=self.serializer)
        except NoSuchJobError:
            return None
        return job if job.origin == self.name else None


def progress_words(meta: dict[str, Any]) -> str:
    """A running job's progress as a person reads it: ``step 12/30 · 3/8 img``."""
    parts = []
    if meta.get("loading"):
        parts.append(str(meta["loading"]))
    if meta.get("steps"):
        parts.append(f"step {meta.get('step') or 0}/{meta['steps']}")
    if meta.get("images"):
        parts.append(f"{meta.get('images_done') or 0}/{meta['images']} img")
    if meta.get("error"):
        parts.append(str(meta["error"]))
    return " · ".join(parts)


def readable_job(job: dict[str, Any]) -> dict[str, Any]:
    """The job page's JSON (``/data/job/<id>.json``), with progress in words and no Requeue
    for a failure that would only repeat."""
    try:
        meta = json.loads(job.get("metadata") or "{}")
    except ValueError:
        return job
    words = progress_words(meta)
    if words:
        job["description"] = f"{job.get('description') or ''} — {words}"
    job["metadata"] = json.dumps(meta, indent=1, sort_keys=True)
    if job.get("status") == "failed" and meta.get("permanent"):
        job["status"] = "failed (permanent: it would fail again; fix the input and enqueue it anew)"
    return job


def _serialize_current_job(original: Any) -> Any:
    def serialize(job: Any) -> Any:
        shown = original(job)
        if isinstance(shown, dict):
            words = progress_words(job.meta or {})
            shown["call_string"] = " · ".join(p for p in (job.description, words) if p)
        return shown

    return serialize


def run_dashboard(
    *,
    redis_url: str,
    bind: str,
    port: int,
    username: str,
    password: str,
    allow_delete: bool,
    poll_ms: int,
    ttl: float = 30.0,
) -> None:
    import rq_dashboard.web as web
    from rq_dashboard.cli import run

    web.blueprint.add_url_rule("/metrics", "diffq_metrics", _metrics_view(redis_url, ttl))
    web.Worker = JSONWorker  # the Workers page: see the module docstring
    web.Queue = ReadOnlyQueue  # its pages change nothing in Redis
    web.serialize_current_job = _serialize_current_job(web.serialize_current_job)
    web.blueprint.after_request(_readable_job_page)
    # in a container this process is PID 1, which the kernel spares SIGTERM's default action:
    # without a handler every `docker compose down` waited out its grace period and killed it
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    args = ["--json", "--bind", bind, "--port", str(port), "--redis-url", redis_url]
    args += ["--username", username, "--password", password, "--poll-interval", str(poll_ms)]
    if not allow_delete:
        args.append("--disable-delete")
    run.main(args=args, prog_name="producer dashboard", standalone_mode=True)


def _metrics_view(redis_url: str, ttl: float) -> Any:
    """``/metrics`` beside the dashboard's pages, behind its basic auth (producer/metrics.py)."""
    from flask import Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from common.queues import PATIENCE_FOREVER, connect
    from producer.metrics import registry_for

    registry = registry_for(connect(redis_url, retries=PATIENCE_FOREVER), ttl=ttl)

    def view() -> Any:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    return view


def _readable_job_page(response: Any) -> Any:
    from flask import request

    if request.path.endswith(".json") and "/data/job/" in request.path and response.is_json:
        response.set_data(json.dumps(readable_job(response.get_json())))
    return response
