"""What every ``producer`` command shares: expected failures said in one line with an exit code,
and the queue's two options."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click
import redis

from common.errors import DiffqError
from common.queues import refusal


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DiffqError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (redis.ConnectionError, redis.ReadOnlyError, redis.AuthenticationError) as exc:
            said = refusal(exc) or f"lost the connection to Redis ({exc})"
            click.echo(f"error: {said}; run the same command again", err=True)
            sys.exit(3)
        except redis.exceptions.NoScriptError:
            click.echo("error: Redis restarted again and again under this command (it lost its scripts each time); "
                       "every chunk queued so far is whole: run the same command again", err=True)  # fmt: skip
            sys.exit(3)
        except redis.exceptions.OutOfMemoryError:
            click.echo(
                "error: Redis is full (its maxmemory) and refused more work; every chunk queued so far is whole. "
                "Give Redis more memory (or let the workers drain the queue), then run the same command again: "
                "it adds only what is missing",
                err=True,
            )
            sys.exit(5)

    return wrapper


def queue_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--queue", help="Queue name [env DIFFQ_QUEUE; default diffq].")(func)
    func = click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL].")(func)
    return func
