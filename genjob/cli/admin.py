"""Operator commands: database migrations and the worker process."""

from __future__ import annotations

import click

from genjob import db
from genjob.settings import get_settings


@click.group("db")
def db_group() -> None:
    """Database schema (Alembic migrations)."""


@db_group.command()
@click.option("--revision", default="head", show_default=True)
def upgrade(revision: str) -> None:
    """Migrate the database (GENJOB_DATABASE_URL) up to REVISION."""
    url = get_settings().database_url
    db.upgrade(url, revision)
    click.echo(f"database at {db.current_revision(url)}")


@db_group.command()
@click.option("--revision", default="base", show_default=True)
def downgrade(revision: str) -> None:
    """Migrate the database down to REVISION (base drops everything)."""
    url = get_settings().database_url
    db.downgrade(url, revision)
    click.echo(f"database at {db.current_revision(url) or 'base'}")


@db_group.command()
def current() -> None:
    """Print the database's revision and the code's head."""
    url = get_settings().database_url
    click.echo(f"database: {db.current_revision(url) or 'base'}\nhead:     {db.head_revision()}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("-Q", "--queue", help="Queue to consume (default: GENJOB_QUEUE).")
@click.option("-c", "--concurrency", type=int, default=1, show_default=True, help="Processes (1 per GPU).")
@click.option("-n", "--hostname", default="genjob@%h", show_default=True, help="Worker name in Flower.")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(queue: str | None, concurrency: int, hostname: str, loglevel: str, celery_args: tuple) -> None:
    """Run a Celery worker that generates queued chunks.

    Acks late, prefetches one chunk, loads models once per process. Extra
    arguments go to `celery worker` as they are.
    """
    settings = get_settings()
    if settings.embedded:
        raise click.ClickException("GENJOB_BROKER_URL is not set: a worker needs a broker (redis://…)")
    from genjob.worker.celery_app import create_app
    from genjob.worker.main import run_worker

    run_worker(
        create_app(settings),
        queue=queue or settings.queue,
        concurrency=concurrency,
        hostname=hostname,
        loglevel=loglevel,
        extra=celery_args,
    )


COMMANDS = (db_group, worker)
