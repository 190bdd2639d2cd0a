"""A deleted file stays deleted (issue 27): ``files.deleted_at``.

A batch's output and error files are written when a client first reads the ended batch. Deleting one
used to remove its row, so the next read wrote it again under a new id. Now a batch's file keeps its
row (its content goes) with the time it was deleted: it is never written again, the batch's
``output_file_id`` still names it, and reading it answers 404, as OpenAI's does. Uploads are still
removed whole.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("files") as batch:
        batch.add_column(
            sa.Column(
                "deleted_at",
                sa.DateTime(timezone=True),
                nullable=True,
                comment="When a batch's output or error file was deleted: the row stays, without content, "
                "so the file is never written again and its batch still names it.",
            )
        )


def downgrade() -> None:
    op.execute("DELETE FROM files WHERE deleted_at IS NOT NULL")  # as a delete left them before
    with op.batch_alter_table("files") as batch:
        batch.drop_column("deleted_at")
