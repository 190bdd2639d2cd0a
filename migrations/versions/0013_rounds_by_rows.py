"""The job's decoding rounds by their row count (issue 42): ``jobs.rounds_by_rows``.

The measured speedup compares plain rounds with drafted rounds of the same (or binned) row count, so a
probe round of a ragged tail's single row is no longer set against rounds of 8–21 rows
(``genjob.stats``). Flat keys ``B:field`` summed over the job's chunks: every round's seconds and output
tokens, and the plain rounds' tokens, seconds and Σ (seconds per token)². Null on jobs recorded
before: they show no measured speedup.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 16:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = (
    "Rounds by their row count B, flat keys B:field: rounds, seconds, output tokens, and of the plain "
    "rounds among them plain_rounds, plain_tokens, plain_seconds, plain_sq (the measured speedup)."
)


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("rounds_by_rows", json, nullable=True, comment=COMMENT))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("rounds_by_rows")
