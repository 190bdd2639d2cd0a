"""``/v1/files``: the OpenAI Files API (uploads for batches, and batches' output and error files).

Shapes as OpenAI documents them (``FileObject``, cursor pages with ``after``/``has_more``); content is
stored in the database (``genjob.store.files``), so every API replica sees the same files. Only your
API key's files are visible: another key's answer 404. Errors have OpenAI's shape
(``genjob.api.openai_errors``). A batch's output or error file, once deleted, stays deleted: its batch
still names it, reads answer 404.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from genjob.api.deps import CallerDep, SessionDep, SettingsDep
from genjob.api.errors import ApiError, openai_error_responses
from genjob.api.uploads import spooled_upload
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.tables import File

# OpenAI's expiry parameters: refused alike on files and batches (a one-line 400), never ignored.
EXPIRY_FIELDS = ("expires_after[anchor]", "expires_after[seconds]", "expires_after")
EXPIRY_REFUSED = (
    "{name} is not supported: a file lasts until it is deleted (DELETE /v1/files/{{id}}), a batch's "
    "output files as long as their batch"
)

router = APIRouter(prefix="/v1/files", tags=["openai"], responses=openai_error_responses(400, 401, 403))

UPLOAD_BODY = {
    "required": True,
    "description": "multipart/form-data: the JSONL file as part 'file', and 'purpose' = batch.",
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file", "purpose"],
                "properties": {
                    "file": {"type": "string", "format": "binary"},
                    "purpose": {"type": "string", "enum": ["batch"]},
                },
            }
        }
    },
}


class FileOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str = Field(description="batch (uploads) or batch_output (a batch's output and error files).")
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None

    @classmethod
    def of(cls, file: File) -> FileOut:
        return cls(
            id=file.id,
            bytes=file.bytes,
            created_at=int(file.created_at.timestamp()),
            filename=file.filename,
            purpose=file.purpose,
        )


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileOut]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


def _not_found(exc: file_store.FileNotFound, param: str | None = None) -> ApiError:
    return ApiError(404, "not_found", str(exc), param=param)


def _store_upload(settings: Settings, owner: str, filename: str, stream: Any) -> File:
    def chunks() -> Iterator[bytes]:
        while block := stream.read(file_store.BLOCK_BYTES):
            yield block

    with session_scope(settings.database_url) as session:
        file = file_store.put_file(session, owner=owner, purpose="batch", filename=filename, chunks=chunks())
        session.expunge(file)
        return file


@router.post(
    "",
    summary="Upload a file (purpose batch): the requests of a batch, one JSON line each",
    responses=openai_error_responses(400, 408, 413, 415, 503),
    openapi_extra={"requestBody": UPLOAD_BODY},
)
async def create_file(request: Request, settings: SettingsDep, caller: CallerDep) -> FileOut:
    """Stored as sent; its lines are checked when a batch is created from it. At most
    GENJOB_MAX_UPLOAD_BYTES (413, checked while it streams in)."""
    async with spooled_upload(
        request,
        owner=caller.owner,
        limit=settings.max_upload_bytes,
        fields=frozenset({"purpose", *EXPIRY_FIELDS}),
        multipart_only=True,
    ) as upload:
        if any(name in upload.fields for name in EXPIRY_FIELDS):
            raise ApiError(
                400, "invalid_request", EXPIRY_REFUSED.format(name="expires_after"), param="expires_after"
            )
        purpose = upload.fields.get("purpose")
        if purpose != "batch":
            raise ApiError(
                400,
                "invalid_request",
                f"purpose must be 'batch' (the only one served here), not {purpose!r}",
                param="purpose",
            )
        file = await run_in_threadpool(_store_upload, settings, caller.owner, upload.source, upload.file.file)
    return FileOut.of(file)


@router.get("", summary="List your files")
def list_files(
    session: SessionDep,
    caller: CallerDep,
    purpose: str | None = None,
    after: Annotated[str | None, Query(max_length=100, description="A file id: the page after it.")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    mark = None
    if after is not None:
        try:
            mark = file_store.get_file(session, file_id=after, owner=caller.scope)
        except file_store.FileNotFound as exc:
            raise _not_found(exc, "after") from exc
    rows = file_store.list_files(
        session,
        owner=caller.scope,
        purpose=purpose,
        after=mark,
        limit=limit + 1,
        newest_first=order == "desc",
    )
    data = [FileOut.of(file) for file in rows[:limit]]
    return FileList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=len(rows) > limit,
    )


@router.get("/{file_id}", summary="A file's details", responses=openai_error_responses(404))
def get_file(file_id: str, session: SessionDep, caller: CallerDep) -> FileOut:
    try:
        return FileOut.of(file_store.get_file(session, file_id=file_id, owner=caller.scope))
    except file_store.FileNotFound as exc:
        raise _not_found(exc) from exc


def _content(settings: Settings, file_id: str) -> Iterator[bytes]:
    with session_scope(settings.database_url) as session:
        yield from file_store.iter_content(session, file_id=file_id)


@router.get(
    "/{file_id}/content",
    summary="A file's content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **openai_error_responses(404)},
)
def file_content(
    file_id: str, session: SessionDep, settings: SettingsDep, caller: CallerDep
) -> StreamingResponse:
    try:
        file = file_store.get_file(session, file_id=file_id, owner=caller.scope)
    except file_store.FileNotFound as exc:
        raise _not_found(exc) from exc
    headers = {"Content-Length": str(file.bytes)}
    return StreamingResponse(
        _content(settings, file.id), media_type="application/octet-stream", headers=headers
    )


@router.delete("/{file_id}", summary="Delete a file", responses=openai_error_responses(404))
def delete_file(file_id: str, session: SessionDep, caller: CallerDep) -> FileDeleted:
    try:
        file = file_store.get_file(session, file_id=file_id, owner=caller.scope)
    except file_store.FileNotFound as exc:
        raise _not_found(exc) from exc
    file_store.delete_file(session, file=file)
    session.commit()  # before the answer: the client's next request must not find it
    return FileDeleted(id=file_id)
