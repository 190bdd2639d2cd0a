"""Files of the OpenAI-compatible API, stored in the database so every API replica sees the same ones.

A file is a row of ``files`` (owner, purpose, name, size, sha256) and its content in ``file_chunks``,
blocks of at most ``BLOCK_BYTES`` written and read one at a time: memory stays flat for any size.
Deleting an upload removes it; deleting a batch's output or error file removes its content and keeps
its row, marked ``deleted_at``, so that it is never written again and its batch still names it (as
OpenAI's do): to every read it is gone. These four functions (``put_file``, ``iter_content``,
``delete_file``, plus the reads) are the whole interface the API uses, the seam where object storage
would go. Must not know: Celery, torch, HTTP.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import delete, insert, select, tuple_
from sqlalchemy.orm import Session

from genjob.echo import echoed
from genjob.tables import File, FileChunk, utcnow

BLOCK_BYTES = 1 << 20


class FileNotFound(LookupError):
    def __init__(self, file_id: str) -> None:
        super().__init__(f"no file {echoed(file_id)}")
        self.file_id = file_id


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


def _blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The chunks regrouped into blocks of exactly BLOCK_BYTES (the last one shorter)."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= BLOCK_BYTES:
            yield bytes(buffer[:BLOCK_BYTES])
            del buffer[:BLOCK_BYTES]
    if buffer:
        yield bytes(buffer)


def put_file(
    session: Session,
    *,
    owner: str,
    purpose: str,
    filename: str,
    chunks: Iterable[bytes],
    job_id: str | None = None,
    file_id: str | None = None,
) -> File:
    """Store a file from its content's chunks, block by block, in the caller's transaction."""
    file = File(
        id=file_id or new_file_id(),
        owner=owner,
        purpose=purpose,
        filename=filename[:255],
        bytes=0,
        sha256="",
        job_id=job_id,
    )
    session.add(file)
    session.flush()
    digest = hashlib.sha256()
    size = 0
    for seq, block in enumerate(_blocks(chunks)):
        session.execute(insert(FileChunk).values(file_id=file.id, seq=seq, data=block))
        digest.update(block)
        size += len(block)
    file.bytes, file.sha256 = size, digest.hexdigest()
    session.flush()
    return file


def get_file(session: Session, *, file_id: str, owner: str | None = None) -> File:
    """The file with this id; with ``owner``, only if that owner's (else FileNotFound, as if absent; a
    deleted one too)."""
    file = session.get(File, file_id)
    if file is None or file.deleted_at is not None or owner not in (None, file.owner):
        raise FileNotFound(file_id)
    return file


def list_files(
    session: Session,
    *,
    owner: str | None,
    purpose: str | None = None,
    after: File | None = None,
    limit: int = 20,
    newest_first: bool = True,
) -> Sequence[File]:
    """A page of files, by creation time (then id), starting after the file ``after``."""
    query = select(File).where(File.deleted_at.is_(None))
    if owner is not None:
        query = query.where(File.owner == owner)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    key = tuple_(File.created_at, File.id)
    if after is not None:
        mark = tuple_(after.created_at, after.id)
        query = query.where(key < mark if newest_first else key > mark)
    order = (File.created_at.desc(), File.id.desc()) if newest_first else (File.created_at, File.id)
    return session.scalars(query.order_by(*order).limit(limit)).all()


def iter_content(session: Session, *, file_id: str) -> Iterator[bytes]:
    """The file's content, one block per query (flat memory)."""
    seq = 0
    while True:
        block = session.scalar(
            select(FileChunk.data).where(FileChunk.file_id == file_id, FileChunk.seq == seq)
        )
        if block is None:
            return
        yield bytes(block)
        seq += 1


def delete_file(session: Session, *, file: File) -> None:
    """Remove the file's content, and its row unless it is a batch's (kept, marked deleted)."""
    session.execute(delete(FileChunk).where(FileChunk.file_id == file.id))
    if file.job_id is None:
        session.delete(file)
    else:
        file.deleted_at = utcnow()
    session.flush()


def job_files(session: Session, *, job_id: str) -> dict[str, File]:
    """A batch job's output and error files, by file name: those deleted since too (``deleted_at``)."""
    return {file.filename: file for file in session.scalars(select(File).where(File.job_id == job_id))}
