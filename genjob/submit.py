"""Submit a prompt file as a job: validate it whole, then store the job and its items.

Shared by the CLI and the HTTP API. Validation reads the file once (streamed) and the insert reads
it again inside one transaction, so a bad file leaves the database untouched. Duplicate ids are
found by the database's unique index on (job, id), not by a set of every id in memory: a refused
insert rolls back, and a third read names the lines. Queueing the stored
job is ``genjob.queueing`` (or in-process, embedded); tokenizer work at submit (chat templates,
the context check) goes through the ``SubmitTokenizer`` the caller hands in.
Must not know: torch, transformers, Celery's workers, HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError

from genjob import store
from genjob.constants import InputFormat
from genjob.db import ensure_schema, session_scope
from genjob.formats.lines import InputFileError, InputLimits
from genjob.formats.reader import InputSummary, check_prompts, valid_prompts
from genjob.formats.sources import open_prompt_source
from genjob.formats.tokenizing import SubmitTokenizer
from genjob.options import JobSpec
from genjob.settings import Settings


@dataclass(frozen=True)
class Submitted:
    job_id: str
    items: int


def input_limits(settings: Settings) -> InputLimits:
    return InputLimits(
        max_line_bytes=settings.max_line_bytes,
        max_new_tokens_limit=settings.max_new_tokens_limit,
        max_file_bytes=settings.max_upload_bytes,
    )


def prepare_database(settings: Settings) -> None:
    """Embedded SQLite migrates itself; any other database must already be at head."""
    ensure_schema(settings.database_url, auto_upgrade=settings.database_url.startswith("sqlite"))


def store_job(
    settings: Settings,
    *,
    path: Path,
    spec: JobSpec,
    tokenizer: SubmitTokenizer | None = None,
    name: str | None = None,
    expires_at: datetime | None = None,
    input_format: InputFormat = InputFormat.GENJOB,
    on_phase: Callable[[str], None] | None = None,
) -> Submitted:
    """Validate the whole file, then insert the job and its items in one transaction.

    ``path`` may be a pipe or ``-`` (standard input): it is read once into a bounded spool
    (``genjob.formats.sources``); a directory, a device or a silent named pipe is refused.
    """
    with open_prompt_source(path, limits=input_limits(settings)) as stream:
        return store_job_stream(
            settings,
            stream=stream,
            source=str(path),
            spec=spec,
            tokenizer=tokenizer,
            name=name,
            expires_at=expires_at,
            input_format=input_format,
            on_phase=on_phase,
        )


def store_job_stream(
    settings: Settings,
    *,
    stream: BinaryIO,
    source: str,
    spec: JobSpec,
    tokenizer: SubmitTokenizer | None = None,
    name: str | None = None,
    expires_at: datetime | None = None,
    input_format: InputFormat = InputFormat.GENJOB,
    on_phase: Callable[[str], None] | None = None,
) -> Submitted:
    """``store_job`` on a seekable binary stream (an upload spooled by the API), read twice.

    Chat messages (OpenAI lines) are rendered here by ``tokenizer`` (the target's chat template), so
    the items hold prompt text whichever way they came; prompts are checked against the model's
    context here when the tokenizer can tell. ``on_phase`` hears "validating", then "storing".
    """
    phase = on_phase or (lambda _name: None)
    limits = input_limits(settings)
    phase("validating")
    start = stream.tell()

    def check(duplicate_ids: bool) -> InputSummary:
        stream.seek(start)
        return check_prompts(
            stream,
            source=source,
            limits=limits,
            input_format=input_format,
            tokenizer=tokenizer,
            max_new_tokens=spec.max_new_tokens,
            duplicate_ids=duplicate_ids,
        )

    try:  # ids are left to the database's unique index: no set of every id in memory
        summary = check(duplicate_ids=False)
    except InputFileError:
        check(duplicate_ids=True)  # the full report, duplicates among the other errors
        raise
    stream.seek(start)
    if summary.endpoint is not None:
        spec = spec.model_copy(update={"endpoint": summary.endpoint})
    items = valid_prompts(
        stream, source=source, limits=limits, input_format=input_format, tokenizer=tokenizer
    )
    phase("storing")
    try:
        with session_scope(settings.database_url) as session:
            job = store.create_job(
                session, spec=spec, items=items, queue=settings.queue, name=name, expires_at=expires_at
            )
            assert job.total == summary.count
            return Submitted(job_id=job.id, items=job.total)
    except Exception as exc:
        if not is_duplicate_id(exc):
            raise
    check(duplicate_ids=True)  # nothing was stored; this names the lines (and raises)
    raise AssertionError("the database refused a duplicate id that the file does not have")


def is_duplicate_id(error: BaseException) -> bool:
    """A unique violation of (job_id, custom_id): the file gives one id twice."""
    cause = getattr(error, "orig", None) or error
    duplicate = isinstance(error, IntegrityError) or getattr(cause, "sqlstate", None) == "23505"
    return duplicate and "custom_id" in str(cause)
