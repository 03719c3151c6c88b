"""The ``producer`` command: enqueue prompts files, watch the queue, retry failures.

Expected mistakes (a bad file, a wrong flag, Redis not running) end with one line on stderr
and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import redis
from rq.registry import FailedJobRegistry

from common.errors import ConfigError, DiffqError, InvalidJobSpec
from common.presets import check_adapter, check_model
from common.queues import connect, get_queue
from common.settings import Settings, redact
from producer.enqueue import EnqueueOptions, Enqueuer, check_file
from producer.progress import Progress
from producer.reader import RowDefaults, count_lines, file_format
from producer.status import collect, render


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DiffqError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except redis.ConnectionError as exc:
            click.echo(f"error: lost the connection to Redis ({exc}); run the same command again", err=True)
            sys.exit(3)

    return wrapper


def queue_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--queue", help="Queue name [env DIFFQ_QUEUE; default diffq].")(func)
    func = click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL].")(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """Put prompt jobs on a Redis queue for diffq workers, and watch them run."""


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--model", help="Hub id, local folder, or preset (tiny, sdxl-random) [default SDXL base 1.0].")
@click.option("--adapter", help="DoRA/LoRA folder or .safetensors file (or the preset tiny-dora).")
@click.option("--adapter-scale", type=float, default=1.0, show_default=True, help="Adapter weight.")
@click.option("--steps", type=int, default=30, show_default=True, help="Denoising steps.")
@click.option("--width", type=int, default=1024, show_default=True, help="Image width (multiple of 8).")
@click.option("--height", type=int, default=1024, show_default=True, help="Image height (multiple of 8).")
@click.option("--guidance", type=float, default=5.0, show_default=True, help="Classifier-free guidance scale.")
@click.option("--seed", type=int, help="Seed for rows without one [default: derived from each row, stable].")
@click.option("--num-images", type=int, default=1, show_default=True, help="Images per prompt.")
@click.option("--output", help="Folder the workers write images to [env DIFFQ_OUTPUT; default out].")
@click.option("--chunk-size", type=int, help="Prompts per job, run as one GPU batch [env DIFFQ_CHUNK_SIZE; 8].")
@click.option("--job-timeout", type=int, help="Seconds one job may run [env DIFFQ_JOB_TIMEOUT; 3600].")
@click.option("--max-retries", type=int, help="Retries of a job that failed transiently [3].")
@click.option("--dry-run", is_flag=True, help="Validate and count; enqueue nothing.")
@click.option(
    "--no-path-checks", is_flag=True, help="Do not check that adapter paths exist here (only the workers see them)."
)
@queue_options
@user_errors
def enqueue(file: Path, **opts: Any) -> None:
    """Validate FILE (CSV with a header row, or JSONL) and enqueue its prompts.

    Every row is checked before anything is enqueued. Rows already queued, running or
    done are skipped, so running the same command again resumes an interrupted campaign.
    """
    settings = Settings.load(
        redis_url=opts["redis_url"],
        queue=opts["queue"],
        output=opts["output"],
        model=opts["model"],
        chunk_size=opts["chunk_size"],
        job_timeout=opts["job_timeout"],
        max_retries=opts["max_retries"],
    )
    defaults = RowDefaults(
        model=settings.model,
        width=opts["width"],
        height=opts["height"],
        steps=opts["steps"],
        guidance=opts["guidance"],
        num_images=opts["num_images"],
        seed=opts["seed"],
        adapter=opts["adapter"],
        adapter_scale=opts["adapter_scale"],
        check_paths=not opts["no_path_checks"],
    )
    check_model(settings.model)
    if defaults.adapter and defaults.check_paths:
        try:
            check_adapter(defaults.adapter)
        except InvalidJobSpec as exc:
            raise ConfigError(f"--adapter: {exc}") from None
    conn = None if opts["dry_run"] else connect(settings.redis_url)

    total_rows = count_lines(file) - (file_format(file) == "csv") if file.is_file() else None
    check = Progress("checking", total_rows, "rows")
    rows = check_file(file, defaults, on_row=check.advance)
    if opts["dry_run"]:
        chunks = -(-rows // settings.chunk_size)
        click.echo(
            f"{file}: {rows} rows are valid; about {chunks} job(s) of up to {settings.chunk_size} prompts "
            f"for model {settings.model!r}. Dry run: nothing was enqueued."
        )
        return

    output = str(Path(settings.output).expanduser().absolute())
    options = EnqueueOptions.from_settings(settings, output)
    bar = Progress("enqueue", rows, "rows")
    report = Enqueuer(conn, settings.queue, options).enqueue(file, defaults, on_row=bar.update)
    bar.close()
    click.echo(
        f"{report.new_items} new"
        + (f" ({report.missing_images} done earlier but missing on disk)" if report.missing_images else "")
        + f", {report.known_items} already queued or done"
        + (f", {report.failed_items} failed earlier (producer retry-failed)" if report.failed_items else "")
        + f": enqueued {report.jobs} job(s), {report.images} image(s) on queue {settings.queue!r} "
        f"at {redact(settings.redis_url)}; images go to {output}"
    )


@main.command()
@queue_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@user_errors
def status(queue: str | None, redis_url: str | None, as_json: bool) -> None:
    """Queued, running (by worker/GPU), finished and failed jobs; images written, rate, ETA."""
    settings = Settings.load(queue=queue, redis_url=redis_url)
    st = collect(connect(settings.redis_url), settings.queue)
    if as_json:
        data = asdict(st) | {"pending": st.pending, "eta_s": st.eta_s}
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(render(st, redact(settings.redis_url)))


@main.command()
@queue_options
@click.option("--timeout", type=float, help="Give up (exit 4) after this many seconds.")
@click.option("--poll", type=float, default=1.0, show_default=True, help="Seconds between checks.")
@user_errors
def wait(queue: str | None, redis_url: str | None, timeout: float | None, poll: float) -> None:
    """Block until the queue drains; exit 1 if any job failed."""
    settings = Settings.load(queue=queue, redis_url=redis_url)
    conn = connect(settings.redis_url, retries=0)  # the loop below waits out a Redis restart itself
    started = time.monotonic()
    first = collect(conn, settings.queue, details=False)
    base_done = first.finished + first.failed
    bar = Progress(f"queue {settings.queue}", first.pending, "jobs")
    backoff = poll
    while True:
        try:
            st = collect(conn, settings.queue, details=False)
            backoff = poll
        except (redis.ConnectionError, redis.TimeoutError):
            bar.update(bar.done, extra="(Redis unreachable, retrying)")
            time.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        done = st.finished + st.failed - base_done
        bar.update(max(done, 0), total=max(done, 0) + st.pending, extra=f"{st.images_written} images")
        if st.pending == 0:
            break
        if timeout is not None and time.monotonic() - started > timeout:
            bar.close()
            click.echo(f"error: queue {settings.queue!r} still has {st.pending} job(s) after {timeout:g}s", err=True)
            sys.exit(4)
        time.sleep(poll)
    bar.close(extra=f"{st.images_written} images")
    if st.failed:
        click.echo(
            f"queue {settings.queue!r} drained with {st.failed} failed job(s): "
            "see `producer status`, then `producer retry-failed`",
            err=True,
        )
        sys.exit(1)
    click.echo(f"queue {settings.queue!r} drained: {st.finished} job(s) finished, {st.images_written} images written")


@main.command("retry-failed")
@queue_options
@user_errors
def retry_failed(queue: str | None, redis_url: str | None) -> None:
    """Put every failed job of the queue back on it."""
    settings = Settings.load(queue=queue, redis_url=redis_url)
    q = get_queue(settings.queue, connect(settings.redis_url))
    registry = FailedJobRegistry(queue=q)
    count = 0
    for jid in registry.get_job_ids():
        registry.requeue(jid)
        count += 1
    click.echo(f"re-queued {count} failed job(s) on queue {settings.queue!r}")


if __name__ == "__main__":
    main()
