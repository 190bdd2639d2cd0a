"""Job commands: submit, jobs, status, results, stats, cancel, requeue, retry."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from genjob import store
from genjob.catalog import JobOptionsError, job_spec, parse_job_options
from genjob.cli.options import job_options, option_values
from genjob.cli.output import JOBS_HEADER, job_row, job_stats_lines, job_summary_lines
from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import SchemaError, session_scope
from genjob.durations import parse_duration
from genjob.formats.export import ResultFormat, export_job
from genjob.formats.lines import InputFileError
from genjob.generation.prompt_tokenizer import PromptTokenizer
from genjob.queueing import BrokerUnavailable
from genjob.settings import Settings, get_settings
from genjob.submit import prepare_database, store_job
from genjob.tables import Job, utcnow
from genjob.worker.enqueue import enqueue_job

POLL_SECONDS = 0.5


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def deadline(expire_after: timedelta | None) -> datetime | None:
    return utcnow() + expire_after if expire_after is not None else None


def settings_and_schema() -> Settings:
    settings = get_settings()
    try:
        prepare_database(settings)
    except SchemaError as exc:
        raise click.ClickException(str(exc)) from exc
    return settings


def load_job(settings: Settings, job_id: str) -> Job:
    """The job, ended first if its deadline passed (so it reads right with no worker running)."""
    with session_scope(settings.database_url) as session:
        try:
            job = store.get_job(session, job_id=job_id)
        except store.JobNotFound as exc:
            raise click.ClickException(str(exc)) from exc
        if job.expires_at is not None and store.expire_due_jobs(session, job_id=job.id):
            session.refresh(job)
        return job


def enqueue_or_explain(settings: Settings, *, job_id: str, chunk_size: int) -> int:
    """Queue the job's pending items; a broker that does not answer is the user's error, with the
    command that queues them once it is back (the items are stored: nothing is lost)."""
    try:
        return enqueue_job(settings, job_id=job_id, chunk_size=chunk_size)
    except BrokerUnavailable as exc:
        raise click.ClickException(f"{exc}; once the broker is back: genjob requeue {job_id}") from exc


def wait_for_job(settings: Settings, job_id: str, *, worker: threading.Thread | None = None) -> Job:
    """Follow a job with a progress bar (stderr) until it ends."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        job = load_job(settings, job_id)
        task = progress.add_task(job.status, total=job.total, failed=0)
        while True:
            job = load_job(settings, job_id)
            finished = job.done + job.failed
            progress.update(task, completed=finished, description=job.status, failed=job.failed)
            if job.status in TERMINAL_JOB_STATUSES and (worker is None or not worker.is_alive()):
                return job
            if worker is not None and not worker.is_alive() and job.status not in TERMINAL_JOB_STATUSES:
                return job
            time.sleep(POLL_SECONDS)


class _ChunkRunner(threading.Thread):
    """Embedded mode: run the job's chunks in this process while the main thread shows progress."""

    def __init__(self, settings: Settings, job_id: str, chunk_size: int) -> None:
        super().__init__(name=f"genjob-{job_id}", daemon=True)
        self.settings, self.job_id, self.chunk_size = settings, job_id, chunk_size
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            enqueue_job(self.settings, job_id=self.job_id, chunk_size=self.chunk_size)
        except BaseException as exc:
            self.error = exc


@click.command()
@click.argument("prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@job_options()
@click.option(
    "--expire-after",
    type=Duration(),
    help="Deadline (30s, 10m, 2h, 1d): the job then ends expired, unstarted items too.",
)
@click.option("--wait", is_flag=True, help="Follow the job with a progress bar until it ends.")
def submit(prompts: Path, wait: bool, expire_after: timedelta | None, **values: Any) -> None:
    """Submit PROMPTS (JSONL, one {"prompt": ..., "id": ...} per line) as a job.

    The whole file is validated first; a bad line fails the submit with
    FILE:LINE: reason and nothing is stored. Prints the job id. With
    --input-format openai, lines are OpenAI batch requests
    ({"custom_id": ..., "body": {"prompt" or "messages": ...}}).
    """
    settings = settings_and_schema()
    try:
        options = parse_job_options(option_values(values))
        spec = job_spec(settings, options, allow_paths=True)
    except JobOptionsError as exc:
        raise click.ClickException(f"invalid job options: {exc}") from exc
    try:
        submitted = store_job(
            settings,
            path=prompts,
            spec=spec,
            tokenizer=PromptTokenizer(spec.model),
            name=options.name,
            expires_at=deadline(expire_after),
            input_format=options.input_format,
        )
    except InputFileError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(submitted.job_id)
    chunk_size = options.chunk_size or settings.chunk_size
    if settings.embedded:
        runner = _ChunkRunner(settings, submitted.job_id, chunk_size)
        runner.start()
        job = wait_for_job(settings, submitted.job_id, worker=runner) if wait else None
        runner.join()
        if runner.error is not None:
            raise click.ClickException(f"job {submitted.job_id} crashed: {runner.error}")
    else:
        enqueue_or_explain(settings, job_id=submitted.job_id, chunk_size=chunk_size)
        job = wait_for_job(settings, submitted.job_id) if wait else None
    if wait:
        job = load_job(settings, submitted.job_id)
        click.echo(f"{job.status}: {job.done} done, {job.failed} failed of {job.total}", err=True)
        if job.status != JobStatus.COMPLETED:
            raise SystemExit(1)


@click.command("jobs")
@click.option("--status", type=click.Choice([s.value for s in JobStatus]), help="Only jobs in this state.")
@click.option("-n", "--limit", type=click.IntRange(min=1), default=20, show_default=True)
def list_jobs(status: str | None, limit: int) -> None:
    """List jobs, newest first."""
    settings = settings_and_schema()
    with session_scope(settings.database_url) as session:
        store.expire_due_jobs(session)
        rows = store.list_jobs(session, status=status, limit=limit)
        click.echo(JOBS_HEADER)
        for job in rows:
            click.echo(job_row(job))


@click.command()
@click.argument("job_id")
def status(job_id: str) -> None:
    """Show a job's state, item counts and timestamps."""
    job = load_job(settings_and_schema(), job_id)
    click.echo("\n".join(job_summary_lines(job)))


@click.command()
@click.argument("job_id")
def stats(job_id: str) -> None:
    """Show a job's acceptance rate, accepted tokens per round, tokens/s and speedup."""
    job = load_job(settings_and_schema(), job_id)
    click.echo("\n".join(job_stats_lines(job)))


@click.command()
@click.argument("job_id")
@click.option(
    "--format", "fmt", type=click.Choice([f.value for f in ResultFormat]), default="jsonl", show_default=True
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout."
)
def results(job_id: str, fmt: str, output: Path | None) -> None:
    """Export a job's results in input order (one record per item, with its custom id).

    --format openai writes OpenAI batch output lines ({"custom_id", "response":
    {"body": ...}, "error"}). With -o the file appears only once complete
    (written aside, then renamed).
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    with session_scope(settings.database_url) as session:
        chunks = export_job(session, job=job, fmt=ResultFormat(fmt))
        if output is None:
            for chunk in chunks:
                click.echo(chunk, nl=False)
            return
        handle, temp = tempfile.mkstemp(dir=output.parent or ".", prefix=f".{output.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8", newline="") as stream:
                stream.writelines(chunks)
            os.replace(temp, output)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
    click.echo(f"wrote {job.total} records to {output}", err=True)


@click.command()
@click.argument("job_id")
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
@click.argument("job_id")
@click.option("--chunk-size", type=click.IntRange(min=1), help="Items per task message.")
def requeue(job_id: str, chunk_size: int | None) -> None:
    """Queue a job's pending items again (after the broker was down, say).

    Safe to repeat: workers skip items that are already finished.
    """
    settings = settings_and_schema()
    job = load_job(settings, job_id)
    if job.status in TERMINAL_JOB_STATUSES:
        raise click.ClickException(f"job {job.id} already ended ({job.status})")
    chunks = enqueue_or_explain(settings, job_id=job.id, chunk_size=chunk_size or settings.chunk_size)
    click.echo(f"queued {chunks} chunks of job {job.id}")


@click.command()
@click.argument("job_id")
@click.option("--expire-after", type=Duration(), help="A new deadline (30s, 10m, 2h, 1d); none by default.")
@click.option("--chunk-size", type=click.IntRange(min=1), help="Items per task message.")
def retry(job_id: str, expire_after: timedelta | None, chunk_size: int | None) -> None:
    """Run a job's failed items again; done items keep their results.

    Each failed item gets GENJOB_MAX_ATTEMPTS fresh tries and the job runs
    until they end. Cancelled and expired jobs are not retried.
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
        raise click.ClickException(f"job {job.id} has no failed items")
    enqueue_or_explain(settings, job_id=job.id, chunk_size=chunk_size or settings.chunk_size)
    click.echo(f"retrying {retried} failed items of job {job.id}")


COMMANDS = (submit, list_jobs, status, stats, results, cancel, requeue, retry)
