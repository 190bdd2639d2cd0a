"""``/v1/jobs``: submit a JSONL upload as a job, list and read jobs, cancel, requeue (results: ``results``).

Submitting goes through the same code as ``genjob submit`` (its options are ``genjob.options.JobOptions``
as query parameters, then ``genjob.catalog.job_spec`` and ``genjob.submit.store_job_stream``), so a job
is the same row whichever way it came in.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Depends, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from genjob import store
from genjob.api.deps import CallerDep, JobDep, SessionDep, SettingsDep, require_api_key
from genjob.api.errors import ApiError, ErrorDetail, error_responses
from genjob.api.prompt_tokenizer import PromptTokenizer
from genjob.api.quota import check_quota
from genjob.api.schemas import JobList, JobOut, RequeueOut
from genjob.api.uploads import UPLOAD_REQUEST_BODY, spooled_upload
from genjob.catalog import JobOptionsError, job_spec
from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import session_scope
from genjob.formats.lines import InputFileError
from genjob.options import JobOptions
from genjob.queueing import BrokerUnavailable
from genjob.settings import Settings
from genjob.store.idempotency import MAX_KEY_CHARS, IdempotencyConflict
from genjob.submit import Submitter, store_job_stream
from genjob.tables import Job
from genjob.worker.enqueue import enqueue_job

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    dependencies=[Depends(require_api_key)],
    responses=error_responses(401, 403, 422),
)


def _load_job(settings: Settings, job_id: str) -> Job:
    with session_scope(settings.database_url) as session:
        return store.get_job(session, job_id=job_id)


async def enqueue_chunks(
    settings: Settings, job_id: str, chunk_size: int, background: BackgroundTasks, everything: bool = False
) -> int:
    """Queue what the job is missing as chunks (returns how many); embedded: run them after the response."""
    if settings.embedded:
        background.add_task(enqueue_job, settings, job_id=job_id, chunk_size=chunk_size)
        return await run_in_threadpool(_count_chunks, settings, job_id, chunk_size)
    try:
        return await run_in_threadpool(
            enqueue_job, settings, job_id=job_id, chunk_size=chunk_size, everything=everything
        )
    except BrokerUnavailable as exc:
        log.warning("%s", exc)  # the broker (password masked) and why: for the operator, not the client
        raise ApiError(
            503,
            "broker_unavailable",
            f"the broker is unavailable: job {job_id} is stored but not queued; "
            f"POST /v1/jobs/{job_id}/requeue once the broker is back",
            details=[ErrorDetail(message="the job is stored", field="job_id")],
        ) from exc


def _count_chunks(settings: Settings, job_id: str, chunk_size: int) -> int:
    with session_scope(settings.database_url) as session:
        return sum(1 for _ in store.pending_ranges(session, job_id=job_id, chunk_size=chunk_size))


IdempotencyKeyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_KEY_CHARS,
        description="Retry-safe submit: the same key with the same upload and options answers the job "
        "the first request made (200, `Idempotent-Replayed: true`), with other content 409; never a second "
        "job. Keys belong to your API key and last as long as the job.",
    ),
]


@router.post(
    "",
    status_code=201,
    summary="Submit a JSONL upload as a job",
    responses=error_responses(400, 408, 409, 413, 415, 429, 503),
    openapi_extra={"requestBody": UPLOAD_REQUEST_BODY},
)
async def create_job(
    request: Request,
    response: Response,
    settings: SettingsDep,
    caller: CallerDep,
    options: Annotated[JobOptions, Query()],
    background: BackgroundTasks,
    idempotency_key: IdempotencyKeyHeader = None,
) -> JobOut:
    """Validate the whole upload as `genjob submit` does, then store and queue it.

    A bad line answers 422 with every problem (line and field) in `error.details`, and nothing is
    stored. Limits: an upload over GENJOB_MAX_UPLOAD_BYTES answers 413 (checked while it streams in),
    a body that stalls for GENJOB_API_BODY_TIMEOUT_S answers 408, more than GENJOB_API_MAX_UPLOADS
    uploads at once answer 503, a key over its GENJOB_API_QUOTA_TOKENS answers 429.
    """
    try:
        spec = job_spec(settings, options, allow_paths=False)
    except JobOptionsError as exc:
        detail = ErrorDetail(message=str(exc), field=exc.field)
        raise ApiError(422, "invalid_options", f"invalid job options: {exc}", details=[detail]) from exc
    await run_in_threadpool(check_quota, settings, caller.owner)
    submitter = Submitter.of(settings, options, spec, owner=caller.owner)
    async with spooled_upload(request, owner=caller.owner, limit=settings.max_upload_bytes) as upload:
        try:
            submitted = await run_in_threadpool(
                store_job_stream,
                settings,
                stream=upload.file.file,
                source=upload.source,
                spec=spec,
                tokenizer=PromptTokenizer(
                    spec.model, label=options.model, cache_dir=settings.model_cache_dir
                ),
                name=options.name,
                input_format=options.input_format,
                submitter=submitter,
                idempotency_key=idempotency_key,
            )
        except InputFileError as exc:
            raise ApiError.invalid_input(exc) from exc
        except IdempotencyConflict as exc:
            raise ApiError(
                409,
                "idempotency_conflict",
                str(exc),
                details=[ErrorDetail(message=str(exc), field="Idempotency-Key")],
            ) from exc
    if submitted.reused:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    else:
        request.app.state.metrics.jobs_submitted.labels(options.model).inc()
        await enqueue_chunks(
            settings,
            submitted.job_id,
            settings.option_or_setting("chunk_size", options.chunk_size),
            background,
        )
    job = await run_in_threadpool(_load_job, settings, submitted.job_id)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return JobOut.of(job)


@router.get("", summary="List your jobs, newest first")
def list_jobs(
    session: SessionDep,
    caller: CallerDep,
    status: JobStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 20,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> JobList:
    """Your API key's jobs (an admin key: everyone's, the CLI's too)."""
    rows = store.list_jobs(session, status=status, limit=limit + 1, offset=offset, owner=caller.scope)
    more = len(rows) > limit
    return JobList(
        data=[JobOut.of(job) for job in rows[:limit]],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if more else None,
    )


@router.get("/{job_id}", summary="A job: status, counts, stats and speedup", responses=error_responses(404))
def get_job(job: JobDep) -> JobOut:
    return JobOut.of(job)


@router.post("/{job_id}/cancel", summary="Cancel a job", responses=error_responses(404, 409))
def cancel_job(job: JobDep, session: SessionDep) -> JobOut:
    """Nothing new starts and what finished is kept: pending items are cancelled, and the rows in flight
    leave their worker's batch within about a second and end cancelled too (they do not run to their
    end). 409 if the job already ended."""
    if not store.cancel_job(session, job=job):
        raise ApiError(409, "job_ended", f"job {job.id} already ended ({job.status})")
    session.commit()  # before the answer: the client's next read must see it
    return JobOut.of(job)


@router.post("/{job_id}/requeue", summary="Queue what a job is missing", responses=error_responses(404, 503))
async def requeue_job(
    job: JobDep,
    settings: SettingsDep,
    background: BackgroundTasks,
    everything: bool = Query(
        False, alias="all", description="Queue every pending item not held by a live worker again."
    ),
) -> RequeueOut:
    """Queue the items the job's submit did not get to and those whose worker died (``chunks`` 0:
    nothing was missing, or the job already ended). Safe to repeat, on a job in any state."""
    if job.status in TERMINAL_JOB_STATUSES:
        return RequeueOut(job=JobOut.of(job), chunks=0)
    chunks = await enqueue_chunks(settings, job.id, settings.chunk_size, background, everything=everything)
    return RequeueOut(job=JobOut.of(job), chunks=chunks)
