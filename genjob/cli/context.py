"""What every job command starts with: the settings with a checked schema, and the job it names.

A job is named by its id (or a unique prefix: a prefix several ids share is refused with the ids),
or by ``--name NAME``: the newest job of that name, with a note on stderr when several share it.
``job_reference`` adds both to a command and hands it the job's id. A command that only reads the
database (``status``, ``stats``, ``jobs``) takes its URL from ``database_url``, which reads
GENJOB_DATABASE_URL as ``Settings`` does without loading pydantic (a fifth of a second of the
command's start) where no other setting is given. Must not know: the workers, the HTTP API.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import click

from genjob import store
from genjob.db import SchemaError, prepare_schema, session_scope
from genjob.durations import parse_duration
from genjob.echo import echoed
from genjob.store.housekeeping import ids_starting_with, newest_named
from genjob.tables import Job

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from genjob.settings import Settings

CANDIDATES_SHOWN = 5  # ids listed when a prefix names several jobs
EMBEDDED_DATABASE_URL = "sqlite:///./genjob.db"  # genjob.settings' default, kept equal by a test
ENV_FILE = ".env"  # Settings' env_file

F = TypeVar("F", bound=Callable[..., Any])


class Duration(click.ParamType):
    """30s, 10m, 2h, 1d, 1h30m (``genjob.durations``)."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def settings_and_schema() -> Settings:
    from genjob.settings import get_settings

    settings = get_settings()
    _check_schema(settings.database_url)
    return settings


def database_url() -> str:
    """GENJOB_DATABASE_URL as ``Settings().database_url`` reads it: from the environment (its name in
    any case, as pydantic-settings matches it), else the embedded default, with no pydantic loaded.
    Wherever ``Settings`` has anything else to read (a ``.env`` file, another GENJOB_ variable), from
    ``Settings`` itself, so that a bad setting is reported here as by every command."""
    environ = {name.lower(): value for name, value in os.environ.items()}
    others = any(name.startswith("genjob_") and name != "genjob_database_url" for name in environ)
    if others or os.path.isfile(ENV_FILE):
        from genjob.settings import get_settings

        return get_settings().database_url
    return environ.get("genjob_database_url", EMBEDDED_DATABASE_URL)


def database_and_schema() -> str:
    """``database_url``, its schema checked (embedded SQLite: migrated) as ``settings_and_schema`` does."""
    url = database_url()
    _check_schema(url)
    return url


def _check_schema(url: str) -> None:
    try:
        prepare_schema(url)
    except SchemaError as exc:
        raise click.ClickException(str(exc)) from exc


def load_job(settings: Settings, job_id: str) -> Job:
    """The job, ended first if its deadline passed (so it reads right with no worker running)."""
    return load_job_at(settings.database_url, job_id)


def load_job_at(url: str, job_id: str) -> Job:
    """``load_job`` from the database at ``url``."""
    with session_scope(url) as session:
        try:
            job = store.get_job(session, job_id=job_id)
        except store.JobNotFound as exc:
            raise click.ClickException(_not_found(session, job_id, str(exc))) from exc
        if job.expires_at is not None and store.expire_due_jobs(session, job_id=job.id):
            session.refresh(job)
        return job


def _not_found(session: Session, job_id: str, message: str) -> str:
    """``no job 'x'``, or for a prefix several ids share: ``'6' names 3 jobs: 6a…, 6b…, 6c… (give more
    of the id)``, newest first."""
    ids, count = ids_starting_with(session, prefix=job_id, limit=CANDIDATES_SHOWN) if job_id else ([], 0)
    if count < 2:
        return message
    more = f" and {count - len(ids)} more" if count > len(ids) else ""
    return f"{echoed(job_id)} names {count} jobs: {', '.join(ids)}{more} (give more of the id)"


def job_id_by_name(url: str, name: str) -> str:
    """The id of the newest job called ``name`` (a note on stderr if there are several)."""
    with session_scope(url) as session:
        match = newest_named(session, name=name)
        if match is None:
            raise click.ClickException(f"no job named {name!r}")
        if match.count > 1:
            click.echo(
                f"note: {match.count} jobs are named {name!r}; using the newest, {match.job.id} "
                f"(created {match.job.created_at:%Y-%m-%d %H:%M:%S})",
                err=True,
            )
        return match.job.id


def job_reference(command: F) -> F:
    """Give ``command`` a JOB argument or a ``--name NAME`` option; it receives ``job_id`` either way."""

    @functools.wraps(command)
    def resolved(*args: Any, job_id: str | None, job_name: str | None, **kwargs: Any) -> Any:
        if (job_id is None) == (job_name is None):
            raise click.UsageError("name the job: JOB (its id, or a unique prefix) or --name NAME")
        if job_name is not None:
            job_id = job_id_by_name(database_and_schema(), job_name)
        return command(*args, job_id=job_id, **kwargs)

    decorated = click.option(
        "--name", "job_name", metavar="NAME", help="The newest job of this name instead of JOB."
    )(resolved)
    return click.argument("job_id", metavar="JOB", required=False)(decorated)  # type: ignore[return-value]
