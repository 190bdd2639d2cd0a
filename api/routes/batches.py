"""``/v1/batches``: the OpenAI Batch API over genjob jobs (``genjob.batches``).

Create from an uploaded file (``input_file_id``), read, list (``after``, ``limit``), cancel. Objects,
status names, ``request_counts``, ``errors`` and the output and error files as OpenAI documents them.
``Idempotency-Key`` makes a create retry-safe; so does the SDK's own retry header without one.
Only your API key's batches are visible: another key's answer 404. Errors have OpenAI's shape
(``genjob.api.openai_errors``); a batch made is counted in ``genjob_api_jobs_submitted_total`` as a job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, BackgroundTasks, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from genjob import batch_files
from genjob import batches as service
from genjob.api.deps import CallerDep, SessionDep, SettingsDep
from genjob.api.errors import ApiError, ErrorDetail, openai_error_responses
from genjob.api.prompt_tokenizer import PromptTokenizer
from genjob.api.quota import check_quota
from genjob.api.routes.files import EXPIRY_REFUSED
from genjob.api.routes.jobs import IdempotencyKeyHeader, enqueue_chunks
from genjob.constants import OpenAIEndpoint
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.store.idempotency import IdempotencyConflict

router = APIRouter(prefix="/v1/batches", tags=["openai"], responses=openai_error_responses(400, 401, 403))


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=100, description="A file uploaded with purpose batch.")
    endpoint: OpenAIEndpoint = Field(description="/v1/completions or /v1/chat/completions: every line's.")
    completion_window: str = Field(
        default="24h", max_length=16, description="24h (or any duration 1m..7d): then the batch expires."
    )
    metadata: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]] | None = (
        Field(default=None, max_length=16)
    )
    output_expires_after: dict[str, Any] | None = Field(
        default=None,
        description="Not supported (400 when given): output files last as long as their batch, or until "
        "deleted (DELETE /v1/files/{id}).",
    )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool


def _read(settings: Settings, batch_id: str, owner: str | None) -> dict[str, Any]:
    """The batch object, its output files written first if its job has just ended."""
    with session_scope(settings.database_url) as session:
        service.get_batch(session, batch_id=batch_id, owner=owner)
    batch_files.write_outputs(settings, batch_id=batch_id)
    with session_scope(settings.database_url) as session:
        return service.batch_object(session, service.get_batch(session, batch_id=batch_id, owner=owner))


def _not_found(exc: LookupError, param: str | None = None) -> ApiError:
    return ApiError(404, "not_found", str(exc), param=param)


def _job_of(settings: Settings, batch_id: str) -> str | None:
    with session_scope(settings.database_url) as session:
        return service.get_batch(session, batch_id=batch_id, owner=None).job_id


@router.post(
    "",
    summary="Create a batch from an uploaded file of requests",
    responses=openai_error_responses(400, 404, 409, 429, 503),
)
async def create_batch(
    body: BatchCreate,
    request: Request,
    settings: SettingsDep,
    caller: CallerDep,
    background: BackgroundTasks,
    idempotency_key: IdempotencyKeyHeader = None,
    retry_count: Annotated[
        int | None,
        Header(
            alias="x-stainless-retry-count",
            ge=0,
            le=100,
            description="Sent by the OpenAI SDKs: above 0, a retry; without an Idempotency-Key, the same "
            "batch created in the last 10 minutes is answered instead of a new one.",
        ),
    ] = None,
) -> dict[str, Any]:
    """The whole file is checked first: every line names the same allow-listed `body.model` and is a
    request for `endpoint`. A file that fails makes a `failed` batch whose `errors` name the lines.
    Omitted `temperature` is 1.0 (as OpenAI's); `max_tokens` defaults to GENJOB_MAX_NEW_TOKENS."""
    if body.output_expires_after is not None:
        raise ApiError(
            400,
            "invalid_request",
            EXPIRY_REFUSED.format(name="output_expires_after"),
            param="output_expires_after",
        )
    await run_in_threadpool(check_quota, settings, caller.owner)
    batch_request = service.BatchRequest(
        input_file_id=body.input_file_id,
        endpoint=body.endpoint,
        completion_window=body.completion_window,
        metadata=body.metadata,
    )
    try:
        batch_id, reused = await run_in_threadpool(
            service.create_batch,
            settings,
            owner=caller.owner,
            request=batch_request,
            tokenizer_for=lambda location, name: PromptTokenizer(
                location, label=name, cache_dir=settings.model_cache_dir
            ),
            idempotency_key=idempotency_key,
            retried=bool(retry_count),
        )
    except file_store.FileNotFound as exc:
        raise ApiError(
            404, "not_found", str(exc), details=[ErrorDetail(message=str(exc), field="input_file_id")]
        ) from exc
    except service.BatchRequestError as exc:
        raise ApiError(
            400, "invalid_request", str(exc), details=[ErrorDetail(message=str(exc), field=exc.param)]
        ) from exc
    except IdempotencyConflict as exc:
        detail = ErrorDetail(message=str(exc), field="Idempotency-Key")
        raise ApiError(409, "idempotency_conflict", str(exc), details=[detail]) from exc
    job_id = await run_in_threadpool(_job_of, settings, batch_id)
    if job_id is not None and not reused:
        await enqueue_chunks(settings, job_id, settings.chunk_size, background)
    batch = await run_in_threadpool(_read, settings, batch_id, caller.owner)
    if job_id is not None and not reused:  # a batch is a job: counted as POST /v1/jobs counts it
        request.app.state.metrics.jobs_submitted.labels(batch["model"]).inc()
    return batch


@router.get("", summary="List your batches, newest first")
def list_batches(
    session: SessionDep,
    settings: SettingsDep,
    caller: CallerDep,
    after: Annotated[str | None, Query(max_length=100, description="A batch id: the page after it.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    try:
        rows, more = service.list_batches(session, owner=caller.scope, after=after, limit=limit)
    except service.BatchNotFound as exc:
        raise _not_found(exc, "after") from exc
    data = [service.batch_object(session, batch) for batch in rows]
    for number, batch in enumerate(rows):  # a job that has just ended: its files first, as _read does
        if data[number]["status"] in ("finalizing", "cancelling"):
            batch_files.write_outputs(settings, batch_id=batch.id)
            data[number] = service.batch_object(session, batch)
    return BatchList(
        data=data,
        first_id=data[0]["id"] if data else None,
        last_id=data[-1]["id"] if data else None,
        has_more=more,
    )


@router.get("/{batch_id}", summary="A batch: status, request counts, output and error files")
def get_batch(batch_id: str, settings: SettingsDep, caller: CallerDep) -> dict[str, Any]:
    try:
        return _read(settings, batch_id, caller.scope)
    except service.BatchNotFound as exc:
        raise _not_found(exc) from exc


@router.post("/{batch_id}/cancel", summary="Cancel a batch", responses=openai_error_responses(404, 409))
def cancel_batch(
    batch_id: str, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> dict[str, Any]:
    """No new request starts; those in flight finish and are kept (`cancelling` until then, then
    `cancelled` with the finished ones in the output file). 409 if it already ended otherwise."""
    try:
        batch = service.get_batch(session, batch_id=batch_id, owner=caller.scope)
    except service.BatchNotFound as exc:
        raise _not_found(exc) from exc
    if not service.cancel_batch(session, batch=batch):
        raise ApiError(409, "batch_ended", f"batch {batch_id} already ended")
    session.commit()  # before the answer: the client's next read must see it
    return service.batch_object(session, batch)
