"""``GET /v1/jobs/{id}/results``: a job's results streamed in input order, as ``genjob results`` writes them.

JSONL, CSV and OpenAI batch lines stream as they are read; Parquet (binary, its footer written last)
is built in a spooled temporary file first, then streamed. ``status`` keeps one state's items,
``csv_safe`` defuses formula-leading CSV cells; the text is exact otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from tempfile import SpooledTemporaryFile
from typing import Annotated, BinaryIO, Literal, cast

from fastapi import APIRouter, Depends, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from genjob.api.deps import JobDep, SettingsDep, require_api_key
from genjob.api.errors import ApiError, error_responses
from genjob.db import session_scope
from genjob.formats.export import ResultFormat, export_job, iter_result_records
from genjob.formats.parquet import ParquetUnavailable, write_parquet
from genjob.settings import Settings
from genjob.tables import Job

STREAM_CHUNK_CHARS = 64 << 10
SPOOL_MEMORY_BYTES = 8 << 20
MEDIA_TYPES = {
    ResultFormat.JSONL: "application/jsonl",
    ResultFormat.CSV: "text/csv",
    ResultFormat.OPENAI: "application/jsonl",
    ResultFormat.PARQUET: "application/vnd.apache.parquet",
}
EXTENSIONS = {ResultFormat.CSV: "csv", ResultFormat.PARQUET: "parquet"}
ItemFilter = Literal["done", "failed", "pending", "cancelled"]

router = APIRouter(
    prefix="/v1/jobs",
    tags=["jobs"],
    dependencies=[Depends(require_api_key)],
    responses=error_responses(401, 403),
)


def _batched(chunks: Iterator[str]) -> Iterator[str]:
    buffer: list[str] = []
    size = 0
    for chunk in chunks:
        buffer.append(chunk)
        size += len(chunk)
        if size >= STREAM_CHUNK_CHARS:
            yield "".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield "".join(buffer)


def _export(
    settings: Settings, job_id: str, fmt: ResultFormat, status: str | None, csv_safe: bool
) -> Iterator[str]:
    with session_scope(settings.database_url) as session:
        job = session.get_one(Job, job_id)
        yield from _batched(export_job(session, job=job, fmt=fmt, status=status, csv_safe=csv_safe))


def _parquet_file(settings: Settings, job_id: str, status: str | None) -> BinaryIO:
    spool = cast(BinaryIO, SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES))  # noqa: SIM115 (streamed, closed)
    try:
        with session_scope(settings.database_url) as session:
            write_parquet(iter_result_records(session, job_id=job_id, status=status), spool)
        spool.seek(0)
    except BaseException:
        spool.close()
        raise
    return spool


def _stream_file(spool: BinaryIO) -> Iterator[bytes]:
    try:
        while block := spool.read(1 << 20):
            yield block
    finally:
        spool.close()


@router.get(
    "/{job_id}/results",
    summary="Stream a job's results in input order",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One record per item in input order (JSONL, CSV, OpenAI batch lines or Parquet).",
            "content": {
                "application/jsonl": {"schema": {"type": "string"}},
                "text/csv": {"schema": {"type": "string"}},
                "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        **error_responses(404, 501),
    },
)
async def job_results(
    job: JobDep,
    settings: SettingsDep,
    fmt: Annotated[
        ResultFormat, Query(alias="format", description="jsonl, csv, openai or parquet.")
    ] = ResultFormat.JSONL,
    status: Annotated[ItemFilter | None, Query(description="Only the items in this state.")] = None,
    csv_safe: Annotated[
        bool, Query(description="Prefix ' to CSV cells starting with = + - @ (for spreadsheets).")
    ] = False,
) -> StreamingResponse:
    """The same records as `genjob results`; items not finished yet appear with their status."""
    filename = f"{job.id}.{EXTENSIONS.get(fmt, 'jsonl')}"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if fmt is ResultFormat.PARQUET:
        try:
            spool = await run_in_threadpool(_parquet_file, settings, job.id, status)
        except ParquetUnavailable as exc:
            raise ApiError(501, "not_implemented", str(exc)) from exc
        return StreamingResponse(_stream_file(spool), media_type=MEDIA_TYPES[fmt], headers=headers)
    return StreamingResponse(
        _export(settings, job.id, fmt, status, csv_safe), media_type=MEDIA_TYPES[fmt], headers=headers
    )
