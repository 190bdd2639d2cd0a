"""Submit a prompt file as a job: validate it whole, store its items, push its chunks to the queue.

Shared by the CLI and the HTTP API. Validation reads the file once (streamed) and the insert reads
it again inside one transaction, so a bad file leaves the database untouched. Task messages carry
only (job id, item ids). Without a broker (embedded mode) the chunks run in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from kombu.exceptions import OperationalError

from genjob import crud, leases
from genjob.constants import TASK_GENERATE_CHUNK, InputFormat
from genjob.db import ensure_schema, session_scope
from genjob.inputs import (
    InputLimits,
    check_file_size,
    iter_prompt_stream,
    model_context_check,
    summarize_prompt_stream,
)
from genjob.jobspec import JobSpec
from genjob.models import utcnow
from genjob.openai_batch import ChatTemplate
from genjob.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

log = logging.getLogger(__name__)

PUBLISH_RETRY_POLICY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3}


class BrokerUnavailable(RuntimeError):
    """The job is stored but its chunks could not be queued; ``genjob requeue`` can retry."""


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
    name: str | None = None,
    expires_at: datetime | None = None,
    input_format: InputFormat = InputFormat.GENJOB,
) -> Submitted:
    """Validate the whole file, then insert the job and its items in one transaction."""
    check_file_size(path, limits=input_limits(settings))
    with path.open("rb") as stream:
        return store_job_stream(
            settings,
            stream=stream,
            source=str(path),
            spec=spec,
            name=name,
            expires_at=expires_at,
            input_format=input_format,
        )


def store_job_stream(
    settings: Settings,
    *,
    stream: BinaryIO,
    source: str,
    spec: JobSpec,
    name: str | None = None,
    expires_at: datetime | None = None,
    input_format: InputFormat = InputFormat.GENJOB,
) -> Submitted:
    """``store_job`` on a seekable binary stream (an upload spooled by the API), read twice.

    Chat messages (OpenAI lines) are rendered here with the target's chat template, so the items
    hold prompt text whichever way they came. Prompts are checked against the model's context
    here when the model is a local directory.
    """
    limits = input_limits(settings)
    chat = ChatTemplate(spec.model)
    read = {"source": source, "limits": limits, "input_format": input_format, "chat": chat}
    start = stream.tell()
    check = model_context_check(spec.model, max_new_tokens=spec.max_new_tokens)
    summary = summarize_prompt_stream(stream, **read, check=check)
    stream.seek(start)
    if summary.endpoint is not None:
        spec = spec.model_copy(update={"endpoint": summary.endpoint})
    with session_scope(settings.database_url) as session:
        job = crud.create_job(
            session,
            spec=spec,
            items=iter_prompt_stream(stream, **read),
            queue=settings.queue,
            name=name,
            expires_at=expires_at,
        )
        assert job.total == summary.count
        return Submitted(job_id=job.id, items=job.total)


def publish_chunks(app: Celery, *, job_id: str, queue: str, chunks: Iterable[list[int]]) -> int:
    """Send one task message per chunk (retrying a dropped broker connection); returns how many."""
    sent = 0
    try:
        with app.producer_or_acquire() as producer:
            for item_ids in chunks:
                app.send_task(
                    TASK_GENERATE_CHUNK,
                    args=(job_id, item_ids),
                    queue=queue,
                    producer=producer,
                    retry=True,
                    retry_policy=PUBLISH_RETRY_POLICY,
                )
                sent += 1
    except OperationalError as exc:
        raise BrokerUnavailable(
            f"job {job_id} is stored but could not be queued on {app.conf.broker_url}: {exc}"
        ) from exc
    return sent


def enqueue_job(settings: Settings, *, job_id: str, chunk_size: int) -> int:
    """Push the job's pending items as chunks; run them right here in embedded mode. Returns chunks.

    Items whose lease ran out (their worker died) are taken back first; items leased to a live
    worker are left to it. Safe to repeat: workers skip items that are final or held by another.
    """
    from worker.celery_app import create_app

    app = create_app(settings)
    with session_scope(settings.database_url) as session:
        leases.reclaim_expired_leases(session, job_id=job_id)
    if settings.embedded:
        with session_scope(settings.database_url) as session:
            chunks = list(crud.pending_item_chunks(session, job_id=job_id, chunk_size=chunk_size))
        task = app.tasks[TASK_GENERATE_CHUNK]
        for item_ids in chunks:
            task.apply(args=(job_id, item_ids), throw=True)
        return len(chunks)
    with session_scope(settings.database_url) as session:
        queue = crud.get_job(session, job_id=job_id).queue
        chunks = crud.pending_item_chunks(session, job_id=job_id, chunk_size=chunk_size, unleased_at=utcnow())
        return publish_chunks(app, job_id=job_id, queue=queue, chunks=chunks)
