"""The ``producer`` command: enqueue prompts files, watch the queue, retry failures.

Expected mistakes (a bad file, a wrong flag, Redis not running) end with one line on stderr
and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import redis
from click.core import ParameterSource
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from common import adapter_stack, scorers
from common.enqueues import EnqueueRecord
from common.errors import ConfigError, DiffqError, InvalidJobSpec
from common.jobspec import PARAM_DEFAULTS, PARAMS, GenParams, PromptItem
from common.lanes import group_lane, lanes
from common.presets import MODEL_PRESETS, adapter_path, check_model, preset_default
from common.queues import PATIENCE_FOREVER, checked_key, connect, get_queue, images_key
from common.recipes import RECIPES, recipe
from common.scorers import SCORERS, check_scorer_model
from common.settings import Settings, redact
from common.storage import Store, is_url, local_path, problem
from producer.cli_errors import queue_options, user_errors
from producer.enqueue import EnqueueOptions, Enqueuer, check_file, check_output, file_fingerprint
from producer.export import SORT_BUFFER, ExportOptions, describe
from producer.export import export as export_shards
from producer.progress import Progress
from producer.reader import RowDefaults, count_lines, file_format
from producer.shards import FORMATS
from producer.status import collect, render, wait_verdict, wait_words
from producer.web_cli import dashboard, gallery


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """Put prompt jobs on a Redis queue for diffq workers, and watch them run."""


def _default(cls: type, name: str) -> Any:
    """A flag's default is the dataclass field's: every default is defined once."""
    return cls.__dataclass_fields__[name].default


def param_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """A flag per generation parameter that declares one (common/jobspec.py:GenParams): its help,
    type and default (the model preset's own where it has one) come from the declared list."""
    for name, param in reversed(PARAMS.items()):
        if param.flag is None:
            continue
        tiny = preset_default("tiny", name, None)
        default = "none" if PARAM_DEFAULTS[name] is None else PARAM_DEFAULTS[name]
        note = f"default: {default}" + (f"; tiny: {tiny}" if tiny is not None else "")
        flag = f"--{name.replace('_', '-')}"
        func = click.option(flag, type=param.kind, default=None, help=f"{param.flag} [{note}].")(func)
    return func


@main.command(short_help="Check a CSV/JSONL of prompts and queue it (again: resumes, adds nothing twice).")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--model",
    "models",
    multiple=True,
    help=f"Hub id, local folder, or preset ({', '.join(MODEL_PRESETS)}) "
    "[SDXL base 1.0]; again for each row over several models (--model a --model b).",
)
@param_flags
@click.option("--seed", type=int, help="Seed for rows without one [default: derived from each row, stable].")
@click.option(
    "--recipe",
    help=f"A few-step model's settings ({', '.join(RECIPES)}): steps, guidance, sampler, "
    "spacing and size for what cells and flags leave open (docs/usage.md has each one's licence).",
)
@click.option(
    "--score",
    "score",
    help=f"Reward scores each image gets in its worker ({', '.join(SCORERS)}; "
    "name=model for another model), in its metadata line and PNG: clip,aesthetic.",
)
@click.option("--num-images", type=int, default=_default(PromptItem, "num_images"), show_default=True,
              help="Images per prompt, for rows without a num_images cell.")  # fmt: skip
@click.option("--output", help="Folder, or s3:// (any fsspec) URL, the workers write images to "
              "[env DIFFQ_OUTPUT; default out].")  # fmt: skip
@click.option("--chunk-size", type=int, help=f"Prompts per job, run as one GPU batch [env DIFFQ_CHUNK_SIZE; "
              f"{_default(Settings, 'chunk_size')}].")  # fmt: skip
@click.option("--job-timeout", type=int, help=f"Seconds one job may run [{_default(Settings, 'job_timeout')}].")
@click.option("--max-retries", type=int, help=f"Retries of a job that failed transiently "
              f"[{_default(Settings, 'max_retries')}].")  # fmt: skip
@click.option("--retry-backoff", help="Seconds before the 1st, 2nd, ... retry (the last repeats) "
              f"[{_default(Settings, 'retry_backoff')}].")  # fmt: skip
@click.option("--max-queued", type=int, help="Keep at most this many jobs queued, waiting for workers to take "
              "some (bounds Redis memory; 0: no limit) "
              f"[env DIFFQ_MAX_QUEUED; {_default(Settings, 'max_queued')}].")  # fmt: skip
@click.option("--latency", is_flag=True, help="For one image soon rather than many per GPU-hour: the jobs go to "
              "the queue's group lane, which only multi-GPU groups (python -m worker.group) take, first.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Validate and count; enqueue nothing.")
@click.option(
    "--no-path-checks", is_flag=True, help="Do not check that adapter paths exist here (only the workers see them)."
)
@queue_options
@user_errors
def enqueue(file: Path, models: tuple[str, ...], **opts: Any) -> None:
    """Validate FILE (CSV with a header row, or JSONL) and enqueue its prompts.

    Every row is checked before anything is enqueued. Rows already queued, running or
    done are skipped, so running the same command again resumes an interrupted campaign.
    The size, steps, guidance, adapter and images flags are defaults for rows whose cell
    is empty or whose column is missing; a cell always wins. With --model given several
    times, every row is enqueued for each model, one model's jobs after the other's (a worker
    loads each model once, not once a job).
    """
    if len(models) > 1:
        for model in models:  # every model's check passes before any is enqueued
            check_model(model)
            _enqueue(file, {**opts, "model": model, "dry_run": True}, say=False)
        if opts["dry_run"]:
            click.echo(f"{file}: valid for each of {len(models)} models. Dry run: nothing was enqueued.")
            return
    for model in models or (None,):
        _enqueue(file, {**opts, "model": model})


def _enqueue(file: Path, opts: dict[str, Any], say: bool = True) -> None:
    """One model's enqueue of ``file`` (:func:`enqueue`); ``say``: print the dry run's count."""
    settings = Settings.load(
        redis_url=opts["redis_url"],
        queue=opts["queue"],
        output=opts["output"],
        model=opts["model"],
        chunk_size=opts["chunk_size"],
        job_timeout=opts["job_timeout"],
        max_retries=opts["max_retries"],
        retry_backoff=opts["retry_backoff"],
        max_queued=opts["max_queued"],
    )
    defaults = RowDefaults(
        model=settings.model,
        **{  # a flag, else the model preset's own default, else the job spec's
            name: opts[name] if opts[name] is not None else preset_default(settings.model, name, default)
            for name, default in PARAM_DEFAULTS.items()
        },
        num_images=opts["num_images"],
        seed=opts["seed"],
        check_paths=not opts["no_path_checks"],
        recipe=opts["recipe"],
        given=frozenset(name for name in PARAM_DEFAULTS if opts[name] is not None),
    )
    if defaults.recipe:
        try:
            recipe(defaults.recipe)
        except InvalidJobSpec as exc:
            raise ConfigError(f"--recipe: {exc}") from None
    check_model(settings.model)
    if defaults.adapter and defaults.adapters:
        raise ConfigError("--adapter and --adapters are both given: give one adapter, or all of them in --adapters")
    _check_flags(defaults)
    try:
        scores = scorers.parse(opts["score"]) if opts["score"] else ()
        for spec in scores:
            check_scorer_model(spec.partition("=")[2])
    except InvalidJobSpec as exc:
        raise ConfigError(f"--score: {exc}") from None
    if defaults.adapter:
        try:
            adapter_path(defaults.adapter, check=defaults.check_paths)
        except InvalidJobSpec as exc:
            raise ConfigError(f"--adapter: {exc}") from None
    if defaults.adapters:
        try:
            adapter_stack.canonical(defaults.adapters, lambda name: adapter_path(name, check=defaults.check_paths))
        except InvalidJobSpec as exc:
            raise ConfigError(f"--adapters: {exc}") from None
    conn = None if opts["dry_run"] else connect(settings.redis_url)
    output = check_output(settings.output, settings.s3_endpoint_url)

    total_rows = count_lines(file) - (file_format(file) == "csv") if file.is_file() else None
    settings_seen: dict[GenParams, int] = {}  # rows per chunk setting, for --dry-run's count of jobs
    fingerprint = file_fingerprint(file, defaults) if conn is not None and file.is_file() else ""
    if conn is not None and fingerprint and conn.sismember(checked_key(settings.queue), fingerprint):
        # the resume case: the same bytes with the same flags passed the check before
        rows = total_rows or 0
        click.echo(f"{file}: checked before (same content, same flags); not checked again", err=True)
    else:
        check = Progress("checking", total_rows, "rows")
        warnings: list[str] = []
        overridden = dict.fromkeys(_flags_given(), 0)
        rows = check_file(
            file, defaults, on_row=check.advance, warnings=warnings, settings_seen=settings_seen, overridden=overridden
        )
        for warning in warnings:
            click.echo(f"warning: {warning}", err=True)
        for column, won in overridden.items():
            if won:
                flag = "--" + column.replace("_", "-")
                click.echo(
                    f"note: {flag} is for rows without a {column} cell; {won} of {rows} row(s) have their own "
                    f"(a cell wins): empty those cells for {flag} to apply",
                    err=True,
                )
        if conn is not None and fingerprint:
            conn.sadd(checked_key(settings.queue), fingerprint)
    if opts["dry_run"]:
        if not say:
            return
        # rows of equal settings share jobs, so each distinct setting rounds up on its own
        jobs = sum(-(-n // settings.chunk_size) for n in settings_seen.values())
        models = sorted({params.model for params in settings_seen}) or [settings.model]  # a model column adds some
        click.echo(
            f"{file}: {rows} rows are valid; {jobs} job(s) of up to {settings.chunk_size} prompts of equal settings "
            f"({len(settings_seen)} distinct) for model {', '.join(repr(m) for m in models)}, fewer if some are done "
            "or repeated. "
            "Dry run: nothing was enqueued."
        )
        return

    options = replace(EnqueueOptions.from_settings(settings, output), latency=opts["latency"], scores=scores)
    bar = Progress("enqueue", rows, "rows")
    enqueuer = Enqueuer(conn, settings.queue, options)
    enqueuer.on_wait = lambda queued: bar.update(
        bar.done,
        extra=f"· {queued} jobs queued (--max-queued): waiting for workers; Ctrl-C is safe, run again to resume",
    )
    # the campaign is not complete while this is reading its file, nor after it stopped mid-file
    run_id = fingerprint or f"{socket.gethostname()}:{os.getpid()}:{file.resolve()}"
    record = EnqueueRecord(conn, settings.queue, run_id, str(file.resolve()), total_rows, settings.heartbeat_ttl)
    with record:

        def on_row(rows: int) -> None:
            bar.update(rows)
            record.rows(rows)

        report = enqueuer.enqueue(file, defaults, on_row=on_row)
    bar.close()
    click.echo(
        f"{report.new_items} new"
        + (f" ({report.missing_images} done earlier but missing on disk)" if report.missing_images else "")
        + f", {report.known_items} already queued or done"
        + (f", {report.failed_items} failed earlier (producer retry-failed)" if report.failed_items else "")
        + f": enqueued {report.jobs} job(s), {report.images} image(s) on queue {settings.queue!r} "
        + (f"(its group lane {group_lane(settings.queue)!r}: only groups take them) " if opts["latency"] else "")
        + f"at {redact(settings.redis_url)}; images go to {output}"
    )
    if enqueuer.output_gone and report.missing_images:
        click.echo(f"output {output} is gone: its {report.missing_images} done item(s) are made again", err=True)
    if report.unchecked_done:
        click.echo(
            f"output {output} is not visible from this host: {report.unchecked_done} done item(s) were not "
            "checked for missing images (producer verify on a host that sees it checks them)",
            err=True,
        )
    if report.other_output:
        raise ConfigError(
            f"{file}: {report.other_output} row(s) are done on queue {settings.queue!r} for another output, so "
            f"none of them was queued for {output} (a queue is one campaign with one output). To make them in "
            f"{output}, give it a queue of its own: --queue <name> (or DIFFQ_QUEUE)"
        )


def _flags_given() -> list[str]:
    """The row columns whose flag this command line (or its environment) set."""
    ctx = click.get_current_context()
    columns = [*PARAM_DEFAULTS, "num_images", "seed"]
    sources = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return [name for name in columns if name in ctx.params and ctx.get_parameter_source(name) in sources]


def _check_flags(defaults: RowDefaults) -> None:
    """A bad flag is one error about the flag, not the same error once per row."""
    try:
        GenParams(model=defaults.model, **{name: getattr(defaults, name) for name in PARAM_DEFAULTS}).validate()
        PromptItem(prompt="-", seed=defaults.seed or 0, num_images=defaults.num_images).validate()
    except InvalidJobSpec as exc:
        flag = str(exc).split(" ", 1)[0].replace("_", "-")
        raise ConfigError(f"--{flag}: {exc}") from None


@main.command(short_help="Check an output against its queue's ledger; --repair makes them agree.")
@click.argument("output")
@queue_options
@click.option("--repair", is_flag=True, help="Rebuild missing lines from the images, queue again what has no "
              "image, remove fragments and repeated lines.")  # fmt: skip
@click.option("--deep", is_flag=True, help="Decode every image (slow) instead of checking its PNG ends.")
@user_errors
def verify(output: str, queue: str | None, redis_url: str | None, repair: bool, deep: bool) -> None:
    """Does OUTPUT (a folder or s3:// prefix) hold exactly what queue's ledger says is done?

    Every done item has its image(s), each whole, and exactly one metadata line each; every line
    names an image that is there; nothing belongs to an item the queue does not know. Items
    still queued or running are in flight. Exit 0 only when clean (after --repair: when every
    problem was repaired)."""
    from producer.verify import describe as describe_check
    from producer.verify import repair as apply_repairs
    from producer.verify import verify as check

    settings = Settings.load(queue=queue, redis_url=redis_url)
    store = Store(output.rstrip("/") if is_url(output) else str(local_path(output)), settings.s3_endpoint_url)
    if not store.remote and not Path(store.location).is_dir():
        raise ConfigError(f"{output}: no such folder (a folder deleted whole: producer enqueue makes it again)")
    conn = connect(settings.redis_url)
    click.echo(f"reading queue {settings.queue!r}'s ledger and the metadata of {output} ...", err=True)
    bar = Progress(f"verify {output}", 256, "folders")
    try:
        report = check(store, conn, settings.queue, deep=deep, on_bucket=bar.update, ttl=settings.heartbeat_ttl)
    except DiffqError:
        raise
    except Exception as exc:
        line = problem(exc, store.location, settings.s3_endpoint_url)
        if line is None:
            raise
        raise ConfigError(line) from None
    bar.close()
    click.echo("\n".join(describe_check(report, output, settings.queue)))
    if report.clean:
        unfinished = report.in_flight + report.failed
        campaign = collect(conn, settings.queue, details=False, stale_after_s=settings.heartbeat_ttl)
        why = [f"{unfinished} item(s) still queued, running or failed"] if unfinished else []
        why += campaign.not_complete()  # the campaign as status, wait and the metrics see it
        click.echo("clean: the output equals the ledger" + (f"; not finished: {'; '.join(why)}" if why else ""))
        return
    if not repair:
        click.echo("producer verify --repair fixes what can be fixed", err=True)
        sys.exit(1)
    enqueuer = Enqueuer(conn, settings.queue, EnqueueOptions.from_settings(settings, store.location))
    apply_repairs(store, report, enqueuer.requeue)
    unrepaired = report.repairs.unrepairable + report.problems.counts["unknown"]
    if report.problems.counts["count"]:
        if collect(conn, settings.queue, details=False).pending == 0:
            conn.set(images_key(settings.queue), report.images)
            report.repaired.append(f"images counter set to the {report.images} image(s) on disk")
        else:
            click.echo("the images counter is set only while no job is queued or running: repair again then", err=True)
            unrepaired += 1
    click.echo("repaired: " + "; ".join(report.repaired or ["nothing"]))
    if unrepaired:
        click.echo(f"{unrepaired} problem(s) cannot be repaired from here: see above", err=True)
        sys.exit(1)


@main.command(short_help="Write an output (folder or s3:// URL) as WebDataset, Parquet or imagefolder shards.")
@click.argument("source")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Shard format.")
@click.option("--to", "dest", required=True, help="Folder or s3:// (any fsspec) URL to write the shards to.")
@click.option("--shard-size", type=int, default=1000, show_default=True, help="Samples per shard.")
@click.option("--group-by", type=click.Choice(["prompt"]), help="One sample per prompt with all its images "
              "(seeds, adapters, models side by side): preference data.")  # fmt: skip
@click.option("--sort-buffer", type=int, default=SORT_BUFFER, show_default=True,
              help="Metadata lines sorted in memory; more spill to TMPDIR (about the metadata's size).")  # fmt: skip
@click.option("--by", help="The score (from --score at enqueue) that ranks a prompt's images, for --pairs and --top-k.")
@click.option("--pairs", is_flag=True, help="One sample per ranked pair of a prompt's images (Parquet, Pick-a-Pic's "
              "layout: caption, image_0/1, label_0/1, score_0/1, every column _0/_1).")  # fmt: skip
@click.option("--margin", type=float, default=0.0, show_default=True, help="The least score difference of a pair.")
@click.option("--top-k", type=int, help="Keep the best K images of each prompt, by --by.")
@click.option("--where", help="Keep only images where a score or column compares: 'aesthetic > 5.5'.")
@click.option("--overwrite", is_flag=True, help="Replace what --to holds (another export, other files).")
@click.option("--queue", help="Record this queue's counts in the manifest and compare [env DIFFQ_QUEUE].")
@click.option("--redis-url", help="Redis of --queue [env REDIS_URL].")
@user_errors
def export(source: str, fmt: str, dest: str, shard_size: int, group_by: str | None, sort_buffer: int,
           by: str | None, pairs: bool, margin: float, top_k: int | None, where: str | None,
           overwrite: bool, queue: str | None, redis_url: str | None) -> None:  # fmt: skip
    """Export SOURCE, a diffq output folder or bucket prefix, to dataset shards under --to.

    One sample per image (or per prompt with --group-by prompt), sorted, so the same output
    gives the same shards. --to must be empty, hold an unfinished export (run it again after a
    crash: finished shards are kept), or --overwrite replaces what is there; the same export
    again writes nothing. A manifest, diffq-export.json, is written last. Images are read 64 at
    a time; memory stays flat whatever the dataset's size.
    """
    settings = Settings.load(queue=queue, redis_url=redis_url)
    options = ExportOptions(
        format=fmt, shard_size=shard_size, group_by=group_by, sort_buffer=sort_buffer, by=by, pairs=pairs,
        margin=margin, top_k=top_k, where=where,
    ).validate()  # fmt: skip
    src = Store(source.rstrip("/") if is_url(source) else str(local_path(source)), settings.s3_endpoint_url)
    if not src.remote and not Path(src.location).is_dir():
        raise ConfigError(f"{source}: no such folder")
    out = Store(dest.rstrip("/") if is_url(dest) else str(local_path(dest)), settings.s3_endpoint_url)
    click.echo(f"merging and sorting the metadata of {source} ...", err=True)
    bars: list[Progress] = []

    def start(total: int) -> None:
        bars.append(Progress("export", total, "samples"))

    ledger = None
    if queue:
        st = collect(connect(settings.redis_url), settings.queue, details=False)
        ledger = {"queue": settings.queue, "images_written": st.images_written, "images_enqueued": st.images_enqueued,
                  "jobs_pending": st.pending}  # fmt: skip
    report = export_shards(
        src, out, options, on_start=start, on_sample=lambda n: bars[0].advance(n), overwrite=overwrite, ledger=ledger
    )
    if bars:
        bars[0].close()
    click.echo(describe(report, dest))


@main.command(short_help="Queued, running, finished and failed jobs; images, rate, ETA, workers.")
@queue_options
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON (numbers, not text).")
@user_errors
def status(queue: str | None, redis_url: str | None, as_json: bool) -> None:
    """Queued, running (by worker/GPU, with their step), finished and failed jobs; images written
    of the campaign's total; images/s and jobs/s over the last 10 minutes; ETA; live workers,
    and the ones that take no jobs and why."""
    settings = Settings.load(queue=queue, redis_url=redis_url)
    st = collect(connect(settings.redis_url), settings.queue, stale_after_s=settings.heartbeat_ttl)
    if as_json:
        click.echo(json.dumps(st.to_json(), indent=2))
    else:
        click.echo(render(st, redact(settings.redis_url)))


@main.command(short_help="Block until the queue drains, with images/s and ETA; exit 1 if a job failed.")
@queue_options
@click.option("--timeout", type=float, help="Give up (exit 4) after this many seconds.")
@click.option(
    "--stall-timeout",
    type=float,
    help="Give up (exit 4) once nothing has moved (no step, image or job) for this many seconds.",
)
@click.option("--poll", type=float, default=1.0, show_default=True, help="Seconds between checks.")
@user_errors
def wait(queue: str | None, redis_url: str | None, timeout: float | None, stall_timeout: float | None,
         poll: float) -> None:  # fmt: skip
    """Block until the queue drains, showing the whole campaign: images written of its total
    (running jobs' steps included), images/s and jobs/s over the last 10 minutes, and the ETA.
    Exit 1 if any job failed, 4 on --timeout or --stall-timeout."""
    settings = Settings.load(queue=queue, redis_url=redis_url)
    conn = connect(settings.redis_url, retries=0)  # the loop below waits out a Redis restart itself
    started = moved_at = time.monotonic()
    bar = Progress(f"queue {settings.queue}", None, "img", suffix=" written")
    backoff = poll
    last: tuple[object, ...] = ()
    while True:
        try:
            st = collect(conn, settings.queue, stale_after_s=settings.heartbeat_ttl)
            backoff = poll
        except (redis.ConnectionError, redis.TimeoutError):
            bar.update(bar.done, extra="(Redis unreachable, retrying)")
            time.sleep(backoff)
            backoff = min(backoff * 2, 30.0)
            continue
        bar.update(
            st.images_written,
            total=st.images_enqueued or None,
            fraction=st.progress,
            rate=st.images_per_s,
            eta=st.eta_s,
            extra=wait_words(st),
        )
        if wait_verdict(st) is not None:
            break
        now = time.monotonic()
        state = (st.images_written, round(st.images_in_progress, 3), st.finished, st.failed, st.queued, st.running,
                 st.lost, tuple(run.rows_read for run in st.enqueuing))  # fmt: skip
        if state != last:
            last, moved_at = state, now
        if timeout is not None and now - started > timeout:
            bar.close()
            click.echo(f"error: queue {settings.queue!r} still has {st.pending} job(s) after {timeout:g}s", err=True)
            sys.exit(4)
        if stall_timeout is not None and now - moved_at > stall_timeout:
            bar.close()
            why = f" ({st.stalled})" if st.stalled else ""
            click.echo(f"error: queue {settings.queue!r}: nothing moved for {stall_timeout:g}s{why}; "
                       f"{st.pending} job(s) left", err=True)  # fmt: skip
            sys.exit(4)
        time.sleep(poll)
    bar.close(extra=wait_words(st))
    if st.complete:
        written = f"{st.finished} job(s) finished, {st.images_written} images written"
        click.echo(f"queue {settings.queue!r} drained: {written}")
        return
    for run in st.enqueues_stopped:
        click.echo(f"queue {settings.queue!r} is not complete: {run.describe(settings.heartbeat_ttl)}", err=True)
    if st.failed:
        permanent = sum(f.permanent for f in st.failures)
        click.echo(
            f"queue {settings.queue!r} drained with {st.failed} failed job(s): see `producer status`; "
            + ("fix what it says, then " if permanent else "")
            + "`producer retry-failed` re-queues the retryable ones",
            err=True,
        )
        sys.exit(1)
    if st.unaccounted:
        click.echo(
            f"queue {settings.queue!r} has no job left, but {st.unaccounted} image(s) of the campaign are in none "
            "(stopped, cancelled or deleted jobs): producer enqueue of their prompts file queues them again",
            err=True,
        )
        sys.exit(1)
    if not st.enqueues_stopped:
        click.echo(f"queue {settings.queue!r} is not complete: " + "; ".join(st.not_complete()), err=True)
    sys.exit(1)


@main.command(short_help="Cancel the queue's campaign: queued jobs removed, running ones stopped; enqueue resumes.")
@queue_options
@click.option("--dry-run", is_flag=True, help="Say what would be cancelled and stopped; change nothing.")
@user_errors
def cancel(queue: str | None, redis_url: str | None, dry_run: bool) -> None:
    """Cancel every job of the queue that is not over: queued and retrying jobs are removed
    (RQ's canceled registry lists them), running ones are stopped through RQ's stop-job at their
    next step, before any of their images is written. Images already written stay. Their items
    are not done: `producer status` counts them, and the same `producer enqueue` queues them
    again. An enqueue still topping the queue up stops."""
    from producer.cancel import cancel as cancel_campaign
    from producer.cancel import describe as describe_cancel

    settings = Settings.load(queue=queue, redis_url=redis_url)
    conn = connect(settings.redis_url)
    report = cancel_campaign(conn, settings.queue, ttl=settings.heartbeat_ttl, dry_run=dry_run)
    click.echo("\n".join(describe_cancel(report, settings.queue, dry_run)))


@main.command(short_help="Serve the queues' state as Prometheus metrics (jobs by place, images, rate, workers).")
@click.option("--redis-url", help="redis://[user:password@]host:port/db or rediss:// [env REDIS_URL].")
@click.option("--queue", "queues", multiple=True, help="Only this queue (repeat for more) [default: every queue].")
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: everyone).")
@click.option("--port", type=int, default=9182, show_default=True, help="Port to listen on.")
@user_errors
def metrics(redis_url: str | None, queues: tuple[str, ...], bind: str, port: int) -> None:
    """Serve /metrics for Prometheus: read at each scrape by the same code as `producer status`
    (docs/usage.md lists the series). Each worker serves its own with --metrics-port."""
    from prometheus_client import start_http_server

    from producer.metrics import registry_for

    settings = Settings.load(redis_url=redis_url)
    conn = connect(settings.redis_url, retries=PATIENCE_FOREVER)  # a scrape waits out a Redis restart
    try:
        start_http_server(port, addr=bind, registry=registry_for(conn, ttl=settings.heartbeat_ttl, queues=list(queues)))
    except OSError as exc:
        raise ConfigError(f"--port {port}: cannot listen on {bind} ({exc.strerror})") from None
    click.echo(f"metrics of {', '.join(queues) or 'every queue'} at {redact(settings.redis_url)} on "
               f"http://{bind}:{port}/metrics", err=True)  # fmt: skip
    while True:
        time.sleep(3600)


@main.command("retry-failed", short_help="Put failed jobs back on the queue (the retryable ones by default).")
@queue_options
@click.option("--all", "everything", is_flag=True, help="Also jobs that failed permanently (after fixing their input).")
@user_errors
def retry_failed(queue: str | None, redis_url: str | None, everything: bool) -> None:
    """Put the failed jobs of the queue back on it.

    A job that failed permanently (a missing adapter, a model that cannot load, a bad payload,
    out of memory at one image) fails the same way again until its input or the workers are
    fixed, so by default only the others are re-queued; --all re-queues them too.
    """
    settings = Settings.load(queue=queue, redis_url=redis_url)
    conn = connect(settings.redis_url)
    requeued = kept = 0
    for lane in lanes(settings.queue):  # each job goes back to its own lane
        registry = FailedJobRegistry(queue=get_queue(lane, conn))
        ids = registry.get_job_ids()
        for jid, job in zip(ids, Job.fetch_many(ids, connection=conn, serializer=JSONSerializer), strict=True):
            if job is not None and job.meta.get("permanent") and not everything:
                kept += 1
                continue
            registry.requeue(jid)
            requeued += 1
    click.echo(f"re-queued {requeued} failed job(s) on queue {settings.queue!r}")
    if kept:
        click.echo(
            f"{kept} job(s) failed permanently and would fail again: fix what `producer status` says "
            "(their input or the workers), then `producer retry-failed --all`"
        )


main.add_command(dashboard)
main.add_command(gallery)


if __name__ == "__main__":
    main()
