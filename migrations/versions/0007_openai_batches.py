"""The OpenAI Batch API, served (issue 14): owners, idempotency keys, per-line settings, files, batches.

- ``jobs`` gains ``owner`` (the API key's owner id; ``local`` for the CLI and every existing job) with
  an index on (owner, created_at), and the names the submitter used (``model_name``,
  ``assistant_name``), shown instead of server paths;
- ``items`` gains the line's own sampling settings: ``temperature``, ``top_p``, ``seed``, ``stop``;
- ``idempotency_keys``: a client's key per owner and scope, with the fingerprint of the content and
  the job or batch it created;
- ``files`` and ``file_chunks``: the Files API's uploads and batch outputs, stored in the database
  in blocks (so every API replica sees the same files);
- ``batches``: the Batches API's objects, each a job.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 08:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _when(name: str, comment: str, *, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, comment=comment)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "owner",
                sa.String(100),
                nullable=False,
                server_default="local",
                comment="Who submitted it: the API key's owner id (key-…), or local (the CLI).",
            )
        )
        batch.add_column(
            sa.Column(
                "model_name",
                sa.String(500),
                nullable=True,
                comment="The target as the submitter named it (allow-list name): shown instead of paths.",
            )
        )
        batch.add_column(
            sa.Column(
                "assistant_name",
                sa.String(500),
                nullable=True,
                comment="The draft as the submitter named it (allow-list name).",
            )
        )
        batch.create_index("ix_jobs_owner_created_at", ["owner", "created_at"])
    with op.batch_alter_table("items") as batch:
        batch.add_column(
            sa.Column(
                "temperature", sa.Float(), nullable=True, comment="The line's temperature; null: the job's."
            )
        )
        batch.add_column(
            sa.Column("top_p", sa.Float(), nullable=True, comment="The line's top_p; null: the job's.")
        )
        batch.add_column(
            sa.Column(
                "seed",
                sa.BigInteger(),
                nullable=True,
                comment="The line's seed (used as is); null: the job's seed + seq.",
            )
        )
        batch.add_column(
            sa.Column(
                "stop",
                _json(),
                nullable=True,
                comment="The line's stop strings: output ends before the first one.",
            )
        )

    op.create_table(
        "batches",
        sa.Column("id", sa.String(40), nullable=False, comment="Batch id (batch_…)."),
        sa.Column("owner", sa.String(100), nullable=False, comment="The API key's owner id that owns it."),
        sa.Column("job_id", sa.String(32), nullable=True, comment="Its job; null when validation failed."),
        sa.Column("input_file_id", sa.String(40), nullable=False, comment="The uploaded requests (file-…)."),
        sa.Column(
            "endpoint", sa.String(32), nullable=False, comment="/v1/completions or /v1/chat/completions."
        ),
        sa.Column("completion_window", sa.String(16), nullable=False, comment="Time allowed, e.g. 24h."),
        sa.Column("metadata", _json(), nullable=True, comment="The client's metadata (up to 16 pairs)."),
        sa.Column(
            "errors", _json(), nullable=True, comment="Validation errors (code, message, line, param)."
        ),
        _when("created_at", "When it was created.", nullable=False),
        _when("expires_at", "created_at + completion_window: then it ends expired.", nullable=False),
        _when("failed_at", "When its validation failed."),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_batches_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        comment="Batches of the OpenAI-compatible API, each a genjob job.",
    )
    op.create_index("ix_batches_owner_created_at", "batches", ["owner", "created_at"])

    op.create_table(
        "idempotency_keys",
        sa.Column("owner", sa.String(100), nullable=False, comment="The key's owner (API key)."),
        sa.Column("scope", sa.String(16), nullable=False, comment="jobs or batches."),
        sa.Column("key", sa.String(255), nullable=False, comment="The Idempotency-Key given."),
        sa.Column(
            "fingerprint",
            sa.String(64),
            nullable=False,
            comment="sha256 of the request's content: the same key with other content is refused.",
        ),
        sa.Column("job_id", sa.String(32), nullable=True, comment="The job it created."),
        sa.Column("batch_id", sa.String(40), nullable=True, comment="The batch it created."),
        _when("created_at", "When it was first used.", nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_idempotency_keys_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["batch_id"],
            ["batches.id"],
            name=op.f("fk_idempotency_keys_batch_id_batches"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("owner", "scope", "key", name=op.f("pk_idempotency_keys")),
        comment="Idempotency keys of submits and batch creations, per owner.",
    )

    op.create_table(
        "files",
        sa.Column("id", sa.String(40), nullable=False, comment="File id (file-…)."),
        sa.Column("owner", sa.String(100), nullable=False, comment="The API key's owner id that owns it."),
        sa.Column(
            "purpose",
            sa.String(32),
            nullable=False,
            comment="batch (uploads) or batch_output (a batch's output and error files).",
        ),
        sa.Column("filename", sa.String(255), nullable=False, comment="The name given at upload."),
        sa.Column("bytes", sa.BigInteger(), nullable=False, comment="Size of the content in bytes."),
        sa.Column("sha256", sa.String(64), nullable=False, comment="sha256 of the content."),
        _when("created_at", "When it was stored.", nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True, comment="For a batch's output: its job."),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_files_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
        sa.UniqueConstraint("job_id", "filename", name=op.f("uq_files_job_id_filename")),
        comment="Files of the OpenAI-compatible API: uploads and batch outputs.",
    )
    op.create_index("ix_files_owner_created_at", "files", ["owner", "created_at"])

    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(40), nullable=False, comment="Its file."),
        sa.Column("seq", sa.Integer(), nullable=False, comment="Block number, from 0."),
        sa.Column("data", sa.LargeBinary(), nullable=False, comment="The block's bytes."),
        sa.ForeignKeyConstraint(
            ["file_id"], ["files.id"], name=op.f("fk_file_chunks_file_id_files"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("file_id", "seq", name=op.f("pk_file_chunks")),
        comment="The content of files, block by block.",
    )


def downgrade() -> None:
    op.drop_table("file_chunks")
    op.drop_index("ix_files_owner_created_at", table_name="files")
    op.drop_table("files")
    op.drop_table("idempotency_keys")
    op.drop_index("ix_batches_owner_created_at", table_name="batches")
    op.drop_table("batches")
    with op.batch_alter_table("items") as batch:
        for column in ("stop", "seed", "top_p", "temperature"):
            batch.drop_column(column)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_owner_created_at")
        for column in ("assistant_name", "model_name", "owner"):
            batch.drop_column(column)
