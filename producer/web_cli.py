"""The ``producer`` commands a browser reads: ``dashboard`` (rq-dashboard on the queues) and
``gallery`` (an output's images, scores and pairs). Both listen on 127.0.0.1 behind basic auth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from common.errors import ConfigError
from common.queues import connect
from common.settings import Settings, is_placeholder
from producer.cli_errors import user_errors


@click.command(short_help="rq-dashboard for this queue: localhost, basic auth, no delete buttons.")
@click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL].")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: everyone).")
@click.option("--port", type=int, default=9181, show_default=True, help="Port to listen on.")
@click.option("--username", envvar="RQ_DASHBOARD_USERNAME", default="diffq", show_default=True, help="Basic auth user.")
@click.option("--password", envvar="RQ_DASHBOARD_PASSWORD", help="Basic auth password (required).")
@click.option("--allow-delete", is_flag=True, help="Show rq-dashboard's delete and empty buttons.")
@click.option("--poll-ms", type=int, default=2500, show_default=True, help="How often the pages refresh.")
@user_errors
def dashboard(redis_url: str | None, password: str | None, **opts: Any) -> None:
    """Run rq-dashboard on diffq's queues (pip install ".[dashboard]").

    Its Workers page works while jobs run (diffq's jobs are JSON; rq-dashboard alone reads a
    running job with pickle and fails). Listens on 127.0.0.1 with basic auth; reach it from
    another machine through an SSH tunnel, or pass --bind 0.0.0.0 behind your own proxy.
    """
    from producer.dashboard import run_dashboard

    settings = Settings.load(redis_url=redis_url)
    if not password:
        raise ConfigError("the dashboard needs a password: --password or RQ_DASHBOARD_PASSWORD (basic auth)")
    if is_placeholder(password):
        raise ConfigError(
            "RQ_DASHBOARD_PASSWORD is still .env.example's placeholder: set a password of your own "
            "(--password or .env) and start the dashboard again"
        )
    connect(settings.redis_url)  # a wrong URL is one line here, not a stack of Flask errors later
    run_dashboard(redis_url=settings.redis_url, password=password, ttl=settings.heartbeat_ttl, **opts)


@click.command(short_help="Look at an output in a browser: images by prompt, scores, pairs (basic auth).")
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: everyone).")
@click.option("--port", type=int, default=9182, show_default=True, help="Port to listen on.")
@click.option("--username", envvar="RQ_DASHBOARD_USERNAME", default="diffq", show_default=True, help="Basic auth user.")
@click.option("--password", envvar="RQ_DASHBOARD_PASSWORD", help="Basic auth password (required; the dashboard's).")
@user_errors
def gallery(output: Path, bind: str, port: int, username: str, password: str | None) -> None:
    """Serve OUTPUT, a local diffq output folder: / lists its prompts with their images, each
    image's parameters and scores (?where=aesthetic > 5.5, ?by=clip best first); /pairs?by=SCORE
    shows the ranked pairs export --pairs writes, side by side."""
    from producer.gallery import serve

    if not password or is_placeholder(password):
        raise ConfigError("the gallery needs a password of your own: --password or RQ_DASHBOARD_PASSWORD (basic auth)")
    serve(output, bind, port, username, password, say=lambda text: click.echo(text, err=True))
