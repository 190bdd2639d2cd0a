"""SQLAlchemy models of the OpenAI-compatible API: files (uploads and batch outputs) and their content,
batches, and the idempotency keys of submits and batch creations. Re-exported by ``genjob.tables``.
Must not know: torch, Celery, the HTTP API or the CLI.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from genjob.table_base import Base, Json, utcnow


class IdempotencyKey(Base):
    """A client's Idempotency-Key, remembered with what it created: a retry gets the same job or batch."""

    __tablename__ = "idempotency_keys"
    __table_args__ = ({"comment": "Idempotency keys of submits and batch creations, per owner."},)

    owner: Mapped[str] = mapped_column(String(100), primary_key=True, comment="The key's owner (API key).")
    scope: Mapped[str] = mapped_column(String(16), primary_key=True, comment="jobs or batches.")
    key: Mapped[str] = mapped_column(String(255), primary_key=True, comment="The Idempotency-Key given.")
    fingerprint: Mapped[str] = mapped_column(
        String(64), comment="sha256 of the request's content: the same key with other content is refused."
    )
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), comment="The job it created."
    )
    batch_id: Mapped[str | None] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), comment="The batch it created."
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When it was first used."
    )


class File(Base):
    """An uploaded file (OpenAI Files API) or a batch's output or error file; content in ``file_chunks``."""

    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_owner_created_at", "owner", "created_at"),
        UniqueConstraint("job_id", "filename"),
        {"comment": "Files of the OpenAI-compatible API: uploads and batch outputs."},
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, comment="File id (file-…).")
    owner: Mapped[str] = mapped_column(String(100), comment="The API key's owner id that owns it.")
    purpose: Mapped[str] = mapped_column(
        String(32), comment="batch (uploads) or batch_output (a batch's output and error files)."
    )
    filename: Mapped[str] = mapped_column(String(255), comment="The name given at upload.")
    bytes: Mapped[int] = mapped_column(BigInteger, comment="Size of the content in bytes.")
    sha256: Mapped[str] = mapped_column(String(64), comment="sha256 of the content.")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When it was stored."
    )
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), comment="For a batch's output: its job."
    )
    deleted_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="When a batch's output or error file was deleted: the row stays, without content, so "
        "the file is never written again and its batch still names it.",
    )


class FileChunk(Base):
    """A file's content in blocks of at most 1 MiB, streamed in and out (flat memory for any size)."""

    __tablename__ = "file_chunks"
    __table_args__ = ({"comment": "The content of files, block by block."},)

    file_id: Mapped[str] = mapped_column(
        ForeignKey("files.id", ondelete="CASCADE"), primary_key=True, comment="Its file."
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, comment="Block number, from 0.")
    data: Mapped[bytes] = mapped_column(LargeBinary, comment="The block's bytes.")


class Batch(Base):
    """An OpenAI batch: a job (``job_id``) plus what the Batches API shows. A batch whose input failed
    validation has no job, its ``errors`` name the lines."""

    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_owner_created_at", "owner", "created_at"),
        {"comment": "Batches of the OpenAI-compatible API, each a genjob job."},
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, comment="Batch id (batch_…).")
    owner: Mapped[str] = mapped_column(String(100), comment="The API key's owner id that owns it.")
    job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), comment="Its job; null when validation failed."
    )
    input_file_id: Mapped[str] = mapped_column(String(40), comment="The uploaded requests (file-…).")
    endpoint: Mapped[str] = mapped_column(String(32), comment="/v1/completions or /v1/chat/completions.")
    completion_window: Mapped[str] = mapped_column(String(16), comment="Time allowed, e.g. 24h.")
    batch_metadata: Mapped[dict[str, str] | None] = mapped_column(
        "metadata", Json, comment="The client's metadata (up to 16 pairs)."
    )
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(
        Json, comment="Validation errors (code, message, line, param)."
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When it was created."
    )
    expires_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), comment="created_at + completion_window: then it ends expired."
    )
    failed_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="When its validation failed."
    )
