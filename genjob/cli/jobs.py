"""Job commands: submit, jobs, status, stats, cancel, requeue, retry (results: ``genjob.cli.results``)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from genjob import store
from genjob.catalog import JobOptionsError, job_spec, parse_job_options
from genjob.cli.context import Duration, job_reference, load_job, settings_and_schema
from genjob.cli.embedded import EmbeddedRun
from genjob.cli.exits import ExitCode, end_line, job_exit_code
from genjob.cli.follow import follow_job, phases
from genjob.cli.options import job_options, option_values
from genjob.cli.output import (
    JOBS_HEADER,
    job_json,
    job_row,
    job_stats_json,
    job_stats_lines,
    job_summary_lines,
)
from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import session_scope
from genjob.formats.lines import InputFileError
from genjob.generation.prompt_tokenizer import PromptTokenizer
from genjob.queueing import BrokerUnavailable, chunks_to_queue
from genjob.settings import Settings
from genjob.store.idempotency import MAX_KEY_CHARS, IdempotencyConflict
from genjob.submit import Submitter, store_job
from genjob.tables import utcnow
from genjob.worker.enqueue import enqueue_job


def deadline(expire_after: timedelta | None) -> datetime | None:
    return utcnow() + expire_after if expire_after is not None else None


def enqueue_or_explain(settings: Settings, *, job_id: str, chunk_size: int, everything: bool = False) -> int:
    """Queue what the job is missing; a broker that does not answer is the user's error, with the
    command that queues them once it is back (the items are stored: nothing is lost; a worker's
    sweeper also finishes the queueing by itself once the broker is back)."""
    try:
        return enqueue_job(settings, job_id=job_id, chunk_size=chunk_size, everything=everything)
    except BrokerUnavailable as exc:
        raise click.ClickException(f"{exc}; once the broker is back: genjob requeue {job_id}") from exc


@click.command()
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path))
@job_options()
@click.option(
    "--expire-after",
    type=Duration(),
    help="Deadline (30s, 10m, 2h, 1d): the job then ends expired, unstarted items too.",
)
@click.option("--wait", is_flag=True, help="Follow the job with a progress bar until it ends.")
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="Retry-safe submit: a second submit with this KEY and the same file and options prints the "
    "first one's job (and queues nothing); with other content it is refused. Never a second job.",
)
@click.pass_context
def submit(
    ctx: click.Context,
    prompts: Path,
    wait: bool,
    expire_after: timedelta | None,
    idempotency_key: str | None,
    **values: Any,
) -> None:
    """Submit PROMPTS (JSONL, one {"prompt": ..., "id": ...} per line) as a job.

    The whole file is validated first; a bad line fails the submit with
    FILE:LINE: reason and nothing is stored. Prints the job id. PROMPTS may be
    a pipe, or - for standard input. With --input-format openai, lines are
    OpenAI batch requests ({"custom_id": ..., "body": {"prompt" or "messages": ...}}).
    With --wait (and in embedded mode, which runs the job here), the exit code
    tells how the job ended: 0 all done, 3 items failed, 4 cancelled or expired.
    """
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_KEY_CHARS:
        raise click.ClickException(f"--idempotency-key must have 1 to {MAX_KEY_CHARS} characters")
    settings = settings_and_schema()
    try:
        options = parse_job_options(option_values(values))
        spec = job_spec(settings, options, allow_paths=True)
    except JobOptionsError as exc:
        raise click.ClickException(f"invalid job options: {exc}") from exc
    try:
        with phases(wait) as phase:
            submitted = store_job(
                settings,
                path=prompts,
                spec=spec,
                tokenizer=PromptTokenizer(spec.model, cache_dir=settings.model_cache_dir),
                name=options.name,
                expires_at=deadline(expire_after),
                input_format=options.input_format,
                on_phase=phase,
                submitter=Submitter.of(settings, options, spec),
                idempotency_key=idempotency_key,
            )
    except (InputFileError, IdempotencyConflict) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(submitted.job_id)
    chunk_size = options.chunk_size or settings.chunk_size
    if submitted.reused:
        click.echo(f"already submitted with this idempotency key: job {submitted.job_id}", err=True)
        if wait:
            follow_job(settings, submitted.job_id)
            job = load_job(settings, submitted.job_id)
            click.echo(end_line(job), err=True)
            ctx.exit(job_exit_code(job))
        return
    if settings.embedded:
        runner = EmbeddedRun(settings, submitted.job_id, chunk_size)
        runner.start()
        runner.follow(show=wait)
    else:
        with phases(wait) as phase:
            phase("queueing")
            enqueue_or_explain(settings, job_id=submitted.job_id, chunk_size=chunk_size)
        if not wait:
            return
        try:
            follow_job(settings, submitted.job_id)
        except KeyboardInterrupt:
            click.echo(
                f"stopped following job {submitted.job_id}; it goes on: genjob wait {submitted.job_id}",
                err=True,
            )
            ctx.exit(ExitCode.INTERRUPTED)
    job = load_job(settings, submitted.job_id)
    code = job_exit_code(job)
    if wait or code != ExitCode.OK:
        click.echo(end_line(job), err=True)
    ctx.exit(code)


@click.command("jobs")
@click.option("--status", type=click.Choice([s.value for s in JobStatus]), help="Only jobs in this state.")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON array, each job as GET /v1/jobs/{id} has it.")
def list_jobs(status: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    settings = settings_and_schema()
    with session_scope(settings.database_url) as session:
        store.expire_due_jobs(session)
        rows = store.list_jobs(session, status=status, limit=limit)
        if as_json:
            click.echo(json.dumps([job_json(job) for job in rows], ensure_ascii=False, indent=2))
            return
        click.echo(JOBS_HEADER)
        for job in rows:
            click.echo(job_row(job))


@click.command()
@job_reference
@click.option("--json", "as_json", is_flag=True, help="JSON, as GET /v1/jobs/{id} has it.")
def status(job_id: str, as_json: bool) -> None:
    """Show a job's state, item counts and timestamps."""
    job = load_job(settings_and_schema(), job_id)
    if as_json:
        click.echo(json.dumps(job_json(job), ensure_ascii=False, indent=2))
        return
    click.echo("\n".join(job_summary_lines(job)))


@click.command()
@job_reference
@click.option("--json", "as_json", is_flag=True, help="JSON: the figures and the sums they come from.")
def stats(job_id: str, as_json: bool) -> None:
    """Show a job's acceptance rate, accepted tokens per round, tokens/s and speedup."""
    job = load_job(settings_and_schema(), job_id)
    if as_json:
        click.echo(json.dumps(job_stats_json(job), ensure_ascii=False, indent=2))
        return
    click.echo("\n".join(job_stats_lines(job)))


@click.command()
@job_reference
def cancel(job_id: str) -> None:
    """Cancel a job: no new items start; the item in flight finishes and is kept."""
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    with session_scope(settings.database_url) as session:
        job = store.get_job(session, job_id=job.id)
        if not store.cancel_job(session, job=job):
            raise click.ClickException(f"job {job.id} already ended ({job.status})")
    click.echo(f"cancelled {job.id}")


@click.command()
@job_reference
@click.option("--chunk-size", type=click.IntRange(min=1), help="Items per task message.")
@click.option(
    "--all", "everything", is_flag=True, help="Queue every pending item not held by a live worker again."
)
@click.option("--dry-run", is_flag=True, help="Say how many chunks it would queue, and queue nothing.")
def requeue(job_id: str, chunk_size: int | None, everything: bool, dry_run: bool) -> None:
    """Queue what a job is missing (after the broker was down, say).

    That is the items its submit did not get to queue and those whose worker
    died, or, where the broker lost what it held (flushed, restarted without
    persistence), every pending item no live worker holds; nothing when
    nothing is missing. Safe to repeat, on a job in any
    state (an ended job has nothing to queue): workers skip finished items.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        click.echo(f"job {job.id} already ended ({job.status}): nothing to queue")
        return
    size = chunk_size or settings.chunk_size
    if dry_run:
        would = chunks_to_queue(
            settings,
            job_id=job.id,
            chunk_size=size,
            max_attempts=settings.max_attempts,
            everything=everything,
        )
        click.echo(
            f"would queue {would} chunks of job {job.id}" if would else f"job {job.id} is missing nothing"
        )
        return
    chunks = enqueue_or_explain(settings, job_id=job.id, chunk_size=size, everything=everything)
    if chunks:
        click.echo(f"queued {chunks} chunks of job {job.id}")
    else:
        click.echo(f"job {job.id} is missing nothing: its items are queued or held by workers (--all: again)")


@click.command()
@job_reference
@click.option("--expire-after", type=Duration(), help="A new deadline (30s, 10m, 2h, 1d); none by default.")
@click.option("--chunk-size", type=click.IntRange(min=1), help="Items per task message.")
def retry(job_id: str, expire_after: timedelta | None, chunk_size: int | None) -> None:
    """Run a job's failed items again; done items keep their results.

    Each failed item gets GENJOB_MAX_ATTEMPTS fresh tries and the job runs
    until they end; a late result of an earlier try is refused (its fence is
    stale). Safe to repeat: with no failed items left it does nothing.
    Cancelled and expired jobs are not retried.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    with session_scope(settings.database_url) as session:
        job = store.get_job(session, job_id=job.id)
        try:
            retried = store.retry_failed_items(session, job=job, expires_at=deadline(expire_after))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    if not retried:
        click.echo(f"job {job.id} has no failed items: nothing to retry")
        return
    enqueue_or_explain(settings, job_id=job.id, chunk_size=chunk_size or settings.chunk_size, everything=True)
    click.echo(f"retrying {retried} failed items of job {job.id}")


COMMANDS = (submit, list_jobs, status, stats, cancel, requeue, retry)
