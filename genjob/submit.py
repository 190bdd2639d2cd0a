"""Submit a prompt file as a job: check every line and store the job and its items, or nothing.

Shared by the CLI and the HTTP API. One streamed read checks each line and feeds it to the items'
``COPY`` inside one transaction; the first bad line rolls it back, so a bad file leaves the database
untouched, and a second read then names every problem. Duplicate ids are found by the database's
unique index on (job, id), not by a set of every id in memory. Queueing the stored
job is ``genjob.queueing`` (or in-process, embedded); tokenizer work at submit (chat templates,
the context check) goes through the ``SubmitTokenizer`` the caller hands in.
Must not know: torch, transformers, Celery's workers, HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import InputFormat, OpenAIEndpoint
from genjob.db import prepare_schema, session_scope
from genjob.formats.lines import InputFileError, InputLimits, PromptItem
from genjob.formats.reader import LineChecks, check_prompts, valid_prompts
from genjob.formats.sources import open_prompt_source
from genjob.formats.tokenizing import SubmitTokenizer
from genjob.options import JobOptions, JobSpec
from genjob.settings import Settings
from genjob.store import idempotency as keys
from genjob.tables import LOCAL_OWNER, Job


@dataclass(frozen=True)
class Submitted:
    job_id: str
    items: int
    reused: bool = False  # an earlier submit with the same idempotency key made it


@dataclass(frozen=True)
class Submitter:
    """Who submits (``owner``: the API key's owner id, ``local`` for the CLI) and what they called the
    models (shown instead of the paths the workers load)."""

    owner: str = LOCAL_OWNER
    model_name: str | None = None
    assistant_name: str | None = None

    @classmethod
    def of(
        cls, settings: Settings, options: JobOptions, spec: JobSpec, *, owner: str = LOCAL_OWNER
    ) -> Submitter:
        """The names to show for the job's models: allow-list names only (a path is never kept)."""

        def listed(name: str | None) -> str | None:
            return name if name is not None and settings.model_entry(name) is not None else None

        model = listed(options.model)
        assistant = listed(options.assistant)
        if assistant is None and options.assistant is None and model is not None and spec.assistant:
            assistant = f"{model}:draft"  # the allow-list entry's own draft
        return cls(owner=owner, model_name=model, assistant_name=assistant)


def input_limits(settings: Settings) -> InputLimits:
    return InputLimits(
        max_line_bytes=settings.max_line_bytes,
        max_new_tokens_limit=settings.max_new_tokens_limit,
        max_file_bytes=settings.max_upload_bytes,
    )


def prepare_database(settings: Settings) -> None:
    """Embedded SQLite migrates itself; any other database must already be at head."""
    prepare_schema(settings.database_url)


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
    submitter: Submitter | None = None,
    idempotency_key: str | None = None,
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
            submitter=submitter,
            idempotency_key=idempotency_key,
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
    submitter: Submitter | None = None,
    idempotency_key: str | None = None,
    line_model: str | None = None,
    line_endpoint: OpenAIEndpoint | None = None,
    after_insert: Callable[[Session, str], None] | None = None,
) -> Submitted:
    """``store_job`` on a seekable binary stream (an upload spooled by the API); read once, again to
    report a refused file.

    Chat messages (OpenAI lines) are rendered here by ``tokenizer`` (the target's chat template), so
    the items hold prompt text whichever way they came; prompts are checked against the model's
    context here when the tokenizer can tell. ``on_phase`` hears "validating and storing".
    With ``idempotency_key``, a submit whose key was used before returns that job (``reused``) if the
    content (file and options) is the same, and raises ``IdempotencyConflict`` otherwise: never a
    second job. ``line_model``, ``line_endpoint``: every OpenAI line must name this model and be a
    request for this endpoint (the Batches API), whose ``after_insert(session, job_id)`` adds its
    rows in the job's transaction.
    """
    submitter = submitter or Submitter()
    phase = on_phase or (lambda _name: None)
    limits = input_limits(settings)
    key = None
    if idempotency_key is not None:
        header = json.dumps(
            {"spec": spec.model_dump(mode="json"), "name": name, "format": input_format.value},
            sort_keys=True,
        )
        key = keys.Idempotency(submitter.owner, "jobs", idempotency_key, keys.fingerprint(header, stream))
        earlier = _earlier_submit(settings, key)
        if earlier is not None:
            return earlier
    phase("validating and storing")
    start = stream.tell()

    checks = LineChecks(  # the same checks for both reads (the second also checks ids)
        limits=limits,
        input_format=input_format,
        tokenizer=tokenizer,
        max_new_tokens=spec.max_new_tokens,
        model=line_model,
        endpoint=line_endpoint,
    )

    # One read checks each line and streams it into the COPY; the first bad line rolls the transaction
    # back, and only then is the file read again to report every problem. Ids are left to the
    # database's unique index: no set of every id in memory.
    seen = _SeenEndpoint(line_endpoint)
    items = valid_prompts(stream, checks, source=source)
    try:
        with session_scope(settings.database_url) as session:
            if key is not None:
                keys.claim(session, idempotency=key)  # first: a concurrent retry waits here
            job = store.create_job(
                session,
                spec=spec,
                items=seen.watch(items),
                queue=settings.queue,
                name=name,
                expires_at=expires_at,
                owner=submitter.owner,
                model_name=submitter.model_name,
                assistant_name=submitter.assistant_name,
            )
            if job.total == 0:
                raise _NoPrompts
            if seen.endpoint is not None and seen.endpoint is not spec.endpoint:
                job.spec = spec.model_copy(update={"endpoint": seen.endpoint}).model_dump(mode="json")
            if key is not None:
                keys.bind(session, idempotency=key, job_id=job.id)
            if after_insert is not None:
                after_insert(session, job.id)
            return Submitted(job_id=job.id, items=job.total)
    except (InputFileError, _NoPrompts):
        pass  # rolled back; the report below names the problems
    except Exception as exc:
        if not is_duplicate_id(exc):
            earlier = None
            if key is not None and isinstance(exc, IntegrityError) and keys.is_duplicate(exc):
                earlier = _earlier_submit(settings, key)
            if earlier is None:
                raise
            return earlier
    stream.seek(start)  # nothing was stored: a second read names every problem (ids too) and raises
    check_prompts(stream, checks, source=source, duplicate_ids=True)
    raise AssertionError("the file was refused, but its second read found nothing wrong")


class _NoPrompts(Exception):
    """The file has no prompts: roll back, then report it."""


class _SeenEndpoint:
    """The OpenAI endpoint of the items streamed through ``watch`` (every line's is the same)."""

    def __init__(self, endpoint: OpenAIEndpoint | None) -> None:
        self.endpoint = endpoint

    def watch(self, items: Iterator[PromptItem]) -> Iterator[PromptItem]:
        for item in items:
            if item.endpoint is not None:
                self.endpoint = item.endpoint
            yield item


def is_duplicate_id(error: BaseException) -> bool:
    """A unique violation of (job_id, custom_id): the file gives one id twice."""
    cause = getattr(error, "orig", None) or error
    duplicate = isinstance(error, IntegrityError) or getattr(cause, "sqlstate", None) == "23505"
    return duplicate and "custom_id" in str(cause)


def _earlier_submit(settings: Settings, key: keys.Idempotency) -> Submitted | None:
    """The job an earlier submit with this key made (same content), None if none; raises
    ``IdempotencyConflict`` when the key came with other content."""
    with session_scope(settings.database_url) as session:
        job_id = keys.remembered(session, idempotency=key)
        job = session.get(Job, job_id) if job_id is not None else None
        return Submitted(job_id=job.id, items=job.total, reused=True) if job is not None else None
