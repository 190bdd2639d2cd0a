"""``genjob delete`` and ``genjob purge``: remove a job, or every job that ended long enough ago.

Rows go in batches, each its own transaction (``genjob.store.housekeeping``), so a huge job never
holds the database for long, and a delete or purge that is stopped half-way is finished by running
it again. A live job is deleted only with ``--force``, which cancels it first.
Must not know: the workers, the HTTP API.
"""

from __future__ import annotations

from datetime import timedelta

import click

from genjob import store
from genjob.cli.context import Duration, job_reference, load_job, settings_and_schema
from genjob.cli.output import counted
from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.db import session_scope
from genjob.store.housekeeping import DELETE_BATCH, delete_job_rows, ended_before, purge_ended_jobs
from genjob.tables import utcnow


@click.command()
@job_reference
@click.option("--force", is_flag=True, help="Cancel the job first if it has not ended.")
def delete(job_id: str, force: bool) -> None:
    """Delete a job with its items, results and attempts.

    A queued or running job is refused unless --force, which cancels it
    first (the item in flight on a worker finishes, and is then dropped).
    Stopped half-way, run it again to finish.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    if job.status not in TERMINAL_JOB_STATUSES:
        if not force:
            raise click.ClickException(
                f"job {job.id} is {job.status}: cancel it first (genjob cancel {job.id}) or use --force"
            )
        with session_scope(settings.database_url) as session:
            store.cancel_job(session, job=store.get_job(session, job_id=job.id))
        click.echo(f"cancelled {job.id}", err=True)
    items = delete_job_rows(settings.database_url, job_id=job.id)
    click.echo(f"deleted job {job.id} ({counted(items, 'item')})")


@click.command()
@click.option(
    "--older-than",
    type=Duration(),
    required=True,
    help="Jobs that ended (or, never run, were created) longer ago than this: 30d, 12h.",
)
@click.option("--dry-run", is_flag=True, help="Only count what would go.")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=DELETE_BATCH,
    show_default=True,
    help="Items deleted per transaction.",
)
def purge(older_than: timedelta, dry_run: bool, batch_size: int) -> None:
    """Delete every job that ended longer ago than --older-than, in batches.

    Live jobs are never touched. Safe to interrupt: run it again to go on.
    """
    settings = settings_and_schema()
    cutoff = utcnow() - older_than
    if dry_run:
        with session_scope(settings.database_url) as session:
            due = ended_before(session, cutoff=cutoff, limit=1_000_000)
        items = sum(total for _, total in due)
        click.echo(f"would purge {counted(len(due), 'job')} ({counted(items, 'item')})")
        return
    report = purge_ended_jobs(settings.database_url, cutoff=cutoff, batch=batch_size)
    click.echo(f"purged {counted(report.jobs, 'job')} ({counted(report.items, 'item')})")


COMMANDS = (delete, purge)
