"""Receive a JSONL upload (multipart file or raw ``application/jsonl`` body) into a spooled temp file.

The size limit (``GENJOB_MAX_UPLOAD_BYTES``) is enforced while the body streams in: a declared
``Content-Length`` over it is refused before reading, and a body that grows past it (chunked, or a
lying header) is cut off at the limit with ``413``. Small uploads stay in memory, larger ones roll
over to a temporary file on disk; either way it is gone when the request ends. At most
``GENJOB_API_MAX_UPLOADS`` uploads spool to disk at once, at most half of them one owner's
(``UploadSlots``; more answer 503 with ``Retry-After``), so the disk they take is bounded by that many
times the size limit (plus the multipart overhead); an upload under 1 MiB takes no slot. A body
that sends nothing for ``GENJOB_API_BODY_TIMEOUT_S`` answers 408 (``genjob.api.limits``), and so does one
slower than ``GENJOB_API_BODY_MIN_RATE`` after its grace, or past its deadline (``Admission``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from tempfile import SpooledTemporaryFile
from typing import BinaryIO, cast

from fastapi import Request
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from genjob.api.errors import ApiError

SPOOL_MEMORY_BYTES = 1 << 20  # beyond this the spool rolls over to disk
MULTIPART_OVERHEAD_BYTES = 64 << 10  # boundaries and part headers around the file
UPLOAD_FIELD = "file"
JSONL_MEDIA_TYPES = frozenset(
    {"application/jsonl", "application/x-ndjson", "application/jsonlines", "application/x-jsonlines"}
)
MULTIPART_MEDIA_TYPE = "multipart/form-data"

# The request body the OpenAPI spec documents for POST /v1/jobs.
UPLOAD_REQUEST_BODY = {
    "required": True,
    "description": f"The prompts, one JSON object per line: a multipart part named '{UPLOAD_FIELD}', "
    "or the raw body as application/jsonl (also application/x-ndjson).",
    "content": {
        MULTIPART_MEDIA_TYPE: {
            "schema": {
                "type": "object",
                "required": [UPLOAD_FIELD],
                "properties": {UPLOAD_FIELD: {"type": "string", "format": "binary"}},
            }
        },
        "application/jsonl": {
            "schema": {"type": "string", "format": "binary"},
            "example": '{"prompt": "def fib(n):", "id": "q1"}\n{"prompt": "import os", "id": "q2"}\n',
        },
    },
}


@dataclass
class Upload:
    file: UploadFile  # positioned at its start
    source: str  # how errors name it: the file name, or "upload"
    fields: dict[str, str] = field(default_factory=dict)  # the other form fields asked for


class UploadSlots:
    """How many uploads may spool to disk at once, in all and per owner (one event loop: counters).

    An upload takes a slot only once it outgrows memory (``SPOOL_MEMORY_BYTES``), or at once when its
    declared length says it will; an owner (an API key) holds at most half the slots, so one tenant's
    slow uploads never refuse everyone else's."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_owner = max(1, limit // 2)
        self.active = 0
        self.by_owner: Counter[str] = Counter()

    def take(self, owner: str) -> None:
        mine = self.by_owner[owner] >= self.per_owner
        if mine or self.active >= self.limit:
            raise ApiError(
                503,
                "too_many_uploads",
                (
                    f"this API key already has {self.per_owner} large uploads being received"
                    if mine
                    else f"{self.limit} large uploads are being received already (GENJOB_API_MAX_UPLOADS)"
                )
                + ": retry shortly",
                # answered before the body is read: the connection is not reused (a client that sent
                # its next request on it would meet a server that closed it unread)
                headers={"Retry-After": "5", "Connection": "close"},
            )
        self.active += 1
        self.by_owner[owner] += 1

    def give_back(self, owner: str) -> None:
        self.active -= 1
        self.by_owner[owner] -= 1
        if not self.by_owner[owner]:
            del self.by_owner[owner]


@dataclass
class Admission:
    """One upload's place: its owner, whether it holds a slot, and the pace it must keep."""

    slots: UploadSlots
    owner: str
    min_rate: float  # bytes/s averaged, once ``grace_s`` have passed (0: none)
    grace_s: float
    deadline_s: float
    started: float = field(default_factory=time.monotonic)
    holding: bool = False

    def expect(self, size: int) -> None:
        """The upload is (or will be) ``size`` bytes: past what memory keeps, it needs a slot."""
        if size > SPOOL_MEMORY_BYTES and not self.holding:
            self.slots.take(self.owner)
            self.holding = True

    def received(self, size: int) -> None:
        """``size`` bytes are in so far: take a slot past memory, and check the pace."""
        self.expect(size)
        elapsed = time.monotonic() - self.started
        if elapsed > self.deadline_s:
            raise _too_slow(
                f"the upload was still arriving after {self.deadline_s:g} s (GENJOB_API_BODY_DEADLINE_S)"
            )
        if self.min_rate and elapsed > self.grace_s and size / elapsed < self.min_rate:
            raise _too_slow(
                f"the upload arrived at {size / elapsed:.0f} bytes/s, under {self.min_rate:g} "
                "(GENJOB_API_BODY_MIN_RATE)"
            )

    def release(self) -> None:
        if self.holding:
            self.holding = False
            self.slots.give_back(self.owner)


def _too_slow(message: str) -> ApiError:
    return ApiError(408, "request_timeout", message, headers={"Connection": "close"})


def _too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        "payload_too_large",
        f"the upload is larger than the limit of {limit} bytes (GENJOB_MAX_UPLOAD_BYTES)",
        headers={"Connection": "close"},  # the rest of the body is never read
    )


async def _limited(
    stream: AsyncIterator[bytes], limit: int, upload_limit: int, admission: Admission
) -> AsyncGenerator[bytes, None]:
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            raise _too_large(upload_limit)
        admission.received(size)
        yield chunk


async def _spool_body(request: Request, limit: int, admission: Admission) -> Upload:
    spool = SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 (closed by spooled_upload)
    upload = UploadFile(cast(BinaryIO, spool), size=0, filename=None)
    try:
        async for chunk in _limited(request.stream(), limit, limit, admission):
            await upload.write(chunk)
        await upload.seek(0)
    except BaseException:
        await upload.close()
        raise
    return Upload(file=upload, source="upload")


async def _spool_multipart(
    request: Request, limit: int, fields: frozenset[str], admission: Admission
) -> Upload:
    stream = _limited(request.stream(), limit + MULTIPART_OVERHEAD_BYTES, limit, admission)
    parser = MultiPartParser(request.headers, stream, max_files=1, max_fields=8, max_part_size=64 << 10)
    parser.spool_max_size = SPOOL_MEMORY_BYTES
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, "bad_request", f"invalid multipart body: {exc.message}") from exc
    try:
        unexpected = [key for key in form if key != UPLOAD_FIELD and key not in fields]
        if unexpected:
            wanted = ", ".join(f"'{name}'" for name in sorted(fields)) or "job options are query parameters"
            raise ApiError(
                422,
                "invalid_request",
                f"unexpected form field {unexpected[0]!r}: send the file part '{UPLOAD_FIELD}' ({wanted})",
                param=unexpected[0][:64],
            )
        upload = form.get(UPLOAD_FIELD)
        if not isinstance(upload, UploadFile):
            raise ApiError(
                422,
                "invalid_request",
                f"the multipart body needs a file part named '{UPLOAD_FIELD}' "
                f"(curl -F {UPLOAD_FIELD}=@prompts.jsonl)",
                param=UPLOAD_FIELD,
            )
        if upload.size is not None and upload.size > limit:
            raise _too_large(limit)
    except BaseException:
        await form.close()
        raise
    values = {name: value for name, value in form.items() if name in fields and isinstance(value, str)}
    return Upload(file=upload, source=(upload.filename or "upload")[:200], fields=values)


@asynccontextmanager
async def spooled_upload(
    request: Request,
    *,
    owner: str,
    limit: int,
    fields: frozenset[str] = frozenset(),
    multipart_only: bool = False,
) -> AsyncIterator[Upload]:
    """The request's upload, spooled within ``limit`` bytes; closed (and deleted) on exit. ``fields``:
    the multipart form fields allowed beside the file; ``owner``: whose upload slots it counts in."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    multipart = media_type == MULTIPART_MEDIA_TYPE
    if multipart_only and not multipart:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the file as {MULTIPART_MEDIA_TYPE} (a part named '{UPLOAD_FIELD}')",
        )
    if not multipart and media_type not in JSONL_MEDIA_TYPES:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"send the prompts as {MULTIPART_MEDIA_TYPE} (a part named '{UPLOAD_FIELD}') "
            f"or as application/jsonl, not {media_type or 'a body without Content-Type'}",
        )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + (MULTIPART_OVERHEAD_BYTES if multipart else 0):
        raise _too_large(limit)
    settings = request.app.state.settings
    admission = Admission(
        request.app.state.upload_slots,
        owner,
        min_rate=settings.api_body_min_rate,
        grace_s=settings.api_body_grace_s,
        deadline_s=settings.api_body_deadline_s,
    )
    try:
        if declared.isdigit():
            admission.expect(int(declared))  # a slot at once, before reading, when it will need one
        upload = await (
            _spool_multipart(request, limit, fields, admission)
            if multipart
            else _spool_body(request, limit, admission)
        )
        try:
            yield upload
        finally:
            await upload.file.close()
    finally:
        admission.release()
