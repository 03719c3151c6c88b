"""``producer dashboard``: rq-dashboard, configured for diffq's queues and safe by default.

rq-dashboard 0.9.0's ``--json`` makes it read queues and jobs with RQ's JSON serializer, but its
Workers page builds workers with ``Worker.all()`` and no serializer, so a worker's current job is
read with pickle: the page answers HTTP 500 (``DeserializationError``) whenever a job runs, which
is always during a campaign. It has no setting for that, so this launcher gives its web module a
``Worker`` whose serializer defaults to JSON, then runs rq-dashboard's own command with:
``--json``; ``127.0.0.1`` unless ``--bind`` says otherwise; basic auth, required (it refuses to
start without a password); the delete and empty buttons off unless ``--allow-delete``.
"""

from __future__ import annotations

from typing import Any

from rq import Worker
from rq.serializers import JSONSerializer


class JSONWorker(Worker):
    """``rq.Worker`` read back with the JSON serializer unless told otherwise."""

    def __init__(self, *args: Any, serializer: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, serializer=serializer or JSONSerializer, **kwargs)


def run_dashboard(
    *, redis_url: str, bind: str, port: int, username: str, password: str, allow_delete: bool, poll_ms: int
) -> None:
    import rq_dashboard.web as web
    from rq_dashboard.cli import run

    web.Worker = JSONWorker  # the Workers page: see the module docstring
    args = ["--json", "--bind", bind, "--port", str(port), "--redis-url", redis_url]
    args += ["--username", username, "--password", password, "--poll-interval", str(poll_ms)]
    if not allow_delete:
        args.append("--disable-delete")
    run.main(args=args, prog_name="producer dashboard", standalone_mode=True)
