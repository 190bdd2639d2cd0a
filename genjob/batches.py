"""OpenAI batches as genjob jobs: create one from an uploaded file, read it in OpenAI's shape, cancel it.

A batch is a job (same tables, seen by ``genjob status`` and Flower) plus a ``batches`` row for what
the Batches API shows. Creating one validates the input file whole, as a submit does (every line
names the batch's model, an allow-list name, and is a request for the batch's endpoint); a file that
fails makes a ``failed`` batch whose ``errors`` name the lines, and no job. ``completion_window`` is
the job's deadline. Once the job has ended and nothing runs, its output lines (successes) and error
lines (everything else) are written once as two files (``output_file_id``, ``error_file_id``).
Must not know: torch, transformers, Celery's workers, HTTP.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from tempfile import SpooledTemporaryFile
from typing import Any, BinaryIO, cast

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from genjob import store
from genjob.batch_files import error_name, needed_files, output_name
from genjob.catalog import JobOptionsError, job_spec, parse_job_options
from genjob.constants import TERMINAL_JOB_STATUSES, InputFormat, JobStatus, OpenAIEndpoint
from genjob.db import session_scope
from genjob.durations import parse_duration
from genjob.formats.lines import InputFileError, LineError
from genjob.formats.reader import first_line_model
from genjob.formats.tokenizing import SubmitTokenizer
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.store import idempotency as keys
from genjob.store import openai_batches as batch_rows
from genjob.store.activity import running_items
from genjob.store.openai_batches import BatchNotFound as BatchNotFound  # the API's reads
from genjob.store.openai_batches import get_batch as get_batch
from genjob.store.openai_batches import list_batches as list_batches
from genjob.submit import Submitter, input_limits, store_job_stream
from genjob.tables import Batch, Job, utcnow

SCOPE = "batches"
INPUT_PURPOSE = "batch"
OPENAI_TEMPERATURE = 1.0  # an OpenAI request without temperature samples at 1.0 (genjob jobs: greedy)
MIN_WINDOW, MAX_WINDOW = timedelta(minutes=1), timedelta(days=7)
RETRY_WINDOW = timedelta(minutes=10)  # a retried create without a key returns a same batch this recent
SPOOL_MEMORY_BYTES = 1 << 20


class BatchRequestError(ValueError):
    """A create request that cannot make a batch at all (400): names the parameter."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class BatchRequest:
    input_file_id: str
    endpoint: OpenAIEndpoint
    completion_window: str = "24h"
    metadata: dict[str, str] | None = None

    def canonical(self) -> str:
        body = {
            "input_file_id": self.input_file_id,
            "endpoint": self.endpoint.value,
            "completion_window": self.completion_window,
            "metadata": self.metadata,
        }
        return json.dumps(body, sort_keys=True)


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex[:24]}"


def window(text: str) -> timedelta:
    try:
        span = parse_duration(text)
    except ValueError as exc:
        raise BatchRequestError(f"completion_window: {exc}", "completion_window") from exc
    if not MIN_WINDOW <= span <= MAX_WINDOW:
        raise BatchRequestError(
            "completion_window must be between 1m and 7d (OpenAI: 24h)", "completion_window"
        )
    return span


# --- creating ------------------------------------------------------------------------------------------
def create_batch(
    settings: Settings,
    *,
    owner: str,
    request: BatchRequest,
    tokenizer_for: Callable[[str, str], SubmitTokenizer],
    idempotency_key: str | None = None,
    retried: bool = False,
) -> tuple[str, bool]:
    """Validate the input file and make its batch (and job): (batch id, whether it existed already).

    With ``idempotency_key``, a key used before returns its batch (IdempotencyConflict with other
    content). Without one, a ``retried`` request (the SDK's ``x-stainless-retry-count`` > 0) returns
    this owner's same batch created in the last RETRY_WINDOW, if any: the SDK's own retries of a
    create whose answer was lost make no second batch.
    """
    key = None
    if idempotency_key is not None:
        key = keys.Idempotency(owner, SCOPE, idempotency_key, keys.fingerprint(request.canonical()))
    recent = _recent_same(settings, owner, request) if retried else None
    earlier = _remembered(settings, key) if key is not None else recent
    if earlier is not None:
        return earlier, True
    span = window(request.completion_window)
    batch_id, now = new_batch_id(), utcnow()
    rows: dict[str, Any] = dict(
        id=batch_id, owner=owner, input_file_id=request.input_file_id, batch_metadata=request.metadata
    )
    rows |= dict(completion_window=request.completion_window, endpoint=request.endpoint.value)
    rows |= dict(created_at=now, expires_at=now + span)

    def add_batch(session: Session, job_id: str | None, errors: list[dict[str, Any]] | None = None) -> None:
        if key is not None:
            keys.claim(session, idempotency=key)
        batch_rows.add_batch(session, job_id=job_id, errors=errors, failed_at=now if errors else None, **rows)
        if key is not None:
            keys.bind(session, idempotency=key, batch_id=batch_id)

    try:
        with _input_copy(settings, owner, request.input_file_id) as stream:
            errors = _make_job(
                settings, stream, owner, request, batch_id, now + span, tokenizer_for, add_batch
            )
        if errors is not None:
            with session_scope(settings.database_url) as session:
                add_batch(session, None, errors)
    except IntegrityError as exc:
        earlier = _remembered(settings, key) if key is not None and keys.is_duplicate(exc) else None
        if earlier is None:
            raise
        return earlier, True
    return batch_id, False


def _make_job(
    settings: Settings,
    stream: BinaryIO,
    owner: str,
    request: BatchRequest,
    batch_id: str,
    deadline: datetime,
    tokenizer_for: Callable[[str, str], SubmitTokenizer],
    add_batch: Callable[..., None],
) -> list[dict[str, Any]] | None:
    """Store the batch's job (``add_batch`` in its transaction); the validation errors if it fails."""
    limits = input_limits(settings)
    first = first_line_model(stream, limits=limits)
    if first is None:
        return [_error("empty_file", "the input file has no requests", None, None)]
    line, model = first
    if isinstance(model, LineError):
        return [_line_error(model)]
    if model is None:
        return [_error("missing_model", "the request names no model (body.model)", line, "body.model")]
    try:
        options = parse_job_options(
            {"model": model, "input_format": InputFormat.OPENAI, "temperature": OPENAI_TEMPERATURE}
        )
        spec = job_spec(settings, options, allow_paths=False)
    except JobOptionsError as exc:
        return [_error("model_not_found", str(exc), line, "body.model")]
    submitter = Submitter.of(settings, options, spec, owner=owner)
    try:
        store_job_stream(
            settings,
            stream=stream,
            source=request.input_file_id,
            spec=spec,
            tokenizer=tokenizer_for(spec.model, model),
            name=batch_id,
            expires_at=deadline,
            input_format=InputFormat.OPENAI,
            submitter=submitter,
            line_model=model,
            line_endpoint=request.endpoint,
            after_insert=add_batch,
        )
    except InputFileError as exc:
        errors = [_line_error(error) for error in exc.errors]
        if exc.more:
            errors.append(_error("too_many_errors", f"… and {exc.more} more errors", None, None))
        return errors
    return None


def _error(code: str, message: str, line: int | None, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "line": line, "param": param}


def _line_error(error: LineError) -> dict[str, Any]:
    return _error("invalid_request", error.message, error.line, error.field)


@contextmanager
def _input_copy(settings: Settings, owner: str, file_id: str) -> Iterator[BinaryIO]:
    """The input file's content in a seekable spool (memory, then disk): the owner's, purpose batch."""
    spool = cast(BinaryIO, SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES))  # noqa: SIM115 (closed below)
    try:
        with session_scope(settings.database_url) as session:
            file = file_store.get_file(session, file_id=file_id, owner=owner)
            if file.purpose != INPUT_PURPOSE:
                message = f"file {file_id} has purpose {file.purpose!r}, not 'batch'"
                raise BatchRequestError(message, "input_file_id")
            for block in file_store.iter_content(session, file_id=file.id):
                spool.write(block)
        spool.seek(0)
        yield spool
    finally:
        spool.close()


def _remembered(settings: Settings, key: keys.Idempotency) -> str | None:
    with session_scope(settings.database_url) as session:
        return keys.remembered(session, idempotency=key)


def _recent_same(settings: Settings, owner: str, request: BatchRequest) -> str | None:
    with session_scope(settings.database_url) as session:
        return batch_rows.recent_same_batch(
            session,
            owner=owner,
            input_file_id=request.input_file_id,
            endpoint=request.endpoint.value,
            completion_window=request.completion_window,
            metadata=request.metadata,
            since=utcnow() - RETRY_WINDOW,
        )


# --- reading --------------------------------------------------------------------------------------------
def _status(job: Job | None, unsettled: bool) -> str:
    """``unsettled``: an ended job still has requests running, or its files are not yet written (a
    client that sees a final status finds its output_file_id / error_file_id set)."""
    if job is None:
        return "failed"
    if job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
        return "in_progress"
    if unsettled:
        return "cancelling" if job.status == JobStatus.CANCELLED else "finalizing"
    if job.status == JobStatus.FAILED:
        return "failed" if job.error else "completed"  # a job-wide failure, or every request failed
    return str(job.status)  # completed, cancelled, expired


def _stamp(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def batch_object(session: Session, batch: Batch) -> dict[str, Any]:
    """The batch as OpenAI's Batch object (``genjob.job_id`` added: ``genjob status`` takes it)."""
    job = batch_rows.batch_job(session, batch=batch)
    outputs = file_store.job_files(session, job_id=job.id) if job is not None else {}
    unsettled = (
        job is not None
        and job.status in TERMINAL_JOB_STATUSES
        and bool(
            running_items(session, job_ids=[job.id])
            or any(name not in outputs for name, _ in needed_files(batch, job))
        )
    )
    status = _status(job, unsettled)
    errors = batch.errors
    if job is not None and status == "failed":
        errors = [_error("job_failed", job.error or "every request failed", None, None)]
    ended = job.finished_at if job is not None else None
    output, error = outputs.get(output_name(batch)), outputs.get(error_name(batch))
    prompt_tokens = batch_rows.prompt_tokens(session, job_id=job.id) if job is not None else 0
    completion_tokens = job.new_tokens if job is not None else 0
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": job.model_name if job is not None else None,
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": status,
        "output_file_id": output.id if output is not None else None,
        "error_file_id": error.id if error is not None else None,
        "created_at": _stamp(batch.created_at),
        "in_progress_at": _stamp(batch.created_at) if job is not None else None,
        "expires_at": _stamp(batch.expires_at),
        "finalizing_at": _stamp(ended) if status in ("finalizing", "completed") else None,
        "completed_at": _stamp(ended) if status == "completed" else None,
        "failed_at": _stamp(batch.failed_at or (ended if status == "failed" else None)),
        "expired_at": _stamp(ended) if status == "expired" else None,
        "cancelling_at": _stamp(ended) if status in ("cancelling", "cancelled") else None,
        "cancelled_at": _stamp(ended) if status == "cancelled" else None,
        "request_counts": {
            "total": job.total if job is not None else 0,
            "completed": job.done if job is not None else 0,
            "failed": job.failed if job is not None else 0,
        },
        "metadata": batch.batch_metadata,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "genjob": {"job_id": job.id if job is not None else None},
    }


def cancel_batch(session: Session, *, batch: Batch) -> bool:
    """Cancel the batch's job if it runs; False if it had already ended otherwise than cancelled."""
    job = batch_rows.batch_job(session, batch=batch)
    if job is None:
        return False
    if job.status == JobStatus.CANCELLED:
        return True
    return store.cancel_job(session, job=job)
