"""Job commands: jobs, status, stats, cancel, requeue, retry (submit: ``genjob.cli.submit``; results:
``genjob.cli.results``).

Imports stay light at the top (no Celery, no catalog, no tokenizer, no pydantic): ``genjob status``
must answer fast. The commands that only read (``jobs``, ``status``, ``stats``) take the database URL
alone (``database_and_schema``); what only queueing needs is imported where it queues. Must not know:
the workers, the HTTP API.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import click

from genjob import store
from genjob.cli.context import (
    Duration,
    database_and_schema,
    job_reference,
    load_job,
    load_job_at,
    settings_and_schema,
)
from genjob.cli.output import (
    JOBS_HEADER,
    counted,
    job_json,
    job_row,
    job_stats_json,
    job_stats_lines,
    job_summary_lines,
)
from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import session_scope
from genjob.tables import utcnow

if TYPE_CHECKING:
    from genjob.settings import Settings


def deadline(expire_after: timedelta | None) -> datetime | None:
    return utcnow() + expire_after if expire_after is not None else None


def enqueue_or_explain(settings: Settings, *, job_id: str, chunk_size: int, everything: bool = False) -> int:
    """Queue what the job is missing; a broker that does not answer is the user's error, with the
    command that queues them once it is back (the items are stored: nothing is lost; a worker's
    sweeper also finishes the queueing by itself once the broker is back)."""
    from genjob.queueing import BrokerUnavailable
    from genjob.worker.enqueue import enqueue_job

    try:
        return enqueue_job(settings, job_id=job_id, chunk_size=chunk_size, everything=everything)
    except BrokerUnavailable as exc:
        raise click.ClickException(f"{exc}; once the broker is back: genjob requeue {job_id}") from exc


@click.command("jobs")
@click.option("--status", type=click.Choice([s.value for s in JobStatus]), help="Only jobs in this state.")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON array, each job as GET /v1/jobs/{id} has it.")
def list_jobs(status: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    with session_scope(database_and_schema()) as session:
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
    job = load_job_at(database_and_schema(), job_id)
    if as_json:
        click.echo(json.dumps(job_json(job), ensure_ascii=False, indent=2))
        return
    click.echo("\n".join(job_summary_lines(job)))


@click.command()
@job_reference
@click.option("--json", "as_json", is_flag=True, help="JSON: the figures and the sums they come from.")
def stats(job_id: str, as_json: bool) -> None:
    """Show a job's acceptance rate, wall-clock and decode tokens/s, and speedup.

    Tokens/s two ways: wall-clock (new tokens over the time from when a worker
    took the job to its end: what it delivered) and decoding (over the items'
    own decoding seconds: the models' pace, with queueing, model loading and
    gaps left out).
    """
    job = load_job_at(database_and_schema(), job_id)
    if as_json:
        click.echo(json.dumps(job_stats_json(job), ensure_ascii=False, indent=2))
        return
    click.echo("\n".join(job_stats_lines(job)))


@click.command()
@job_reference
def cancel(job_id: str) -> None:
    """Cancel a job: nothing new starts, what finished is kept.

    Pending items are cancelled; the rows in flight leave their worker's batch
    within about a second and end cancelled too (they do not run to their end).
    """
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
    persistence), every pending item no live worker holds (of every live job,
    once, as a worker's sweeper would); nothing when nothing is missing.
    Idempotent: once it has queued, running it again queues nothing until
    something is lost again (--all queues again anyway). Safe on a job in any
    state (an ended job has nothing to queue): workers skip finished items.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        click.echo(f"job {job.id} already ended ({job.status}): nothing to queue")
        return
    size = settings.option_or_setting("chunk_size", chunk_size)
    if dry_run:
        from genjob.queueing import chunks_to_queue

        would = chunks_to_queue(
            settings,
            job_id=job.id,
            chunk_size=size,
            max_attempts=settings.max_attempts,
            everything=everything,
        )
        if would:
            click.echo(f"would queue {counted(would, 'chunk')} of job {job.id}")
        else:
            click.echo(f"job {job.id} is missing nothing")
        return
    chunks = enqueue_or_explain(settings, job_id=job.id, chunk_size=size, everything=everything)
    if chunks:
        click.echo(f"queued {counted(chunks, 'chunk')} of job {job.id}")
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
    enqueue_or_explain(
        settings,
        job_id=job.id,
        chunk_size=settings.option_or_setting("chunk_size", chunk_size),
        everything=True,
    )
    click.echo(f"retrying {counted(retried, 'failed item')} of job {job.id}")


COMMANDS = (list_jobs, status, stats, cancel, requeue, retry)
