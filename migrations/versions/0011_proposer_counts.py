"""Mode auto's per-proposer counts (issue 25): ``jobs.proposer_counts`` and ``results.proposer_counts``.

A job in mode auto drafts each row, each round, from whichever of its proposers pays (prompt lookup,
the job's suffix cache, the draft model): per proposer, the rounds it drafted for a row, the tokens it
proposed, those accepted and the rejections, flat keys ``name:field``; per item on its result, and
summed per job as its chunks end.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = (
    "Mode auto, per proposer: rounds it drafted for a row, tokens it proposed, accepted, rejections "
    "({'draft:rounds': n, 'draft:proposed': n, …})."
)


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    for table in ("jobs", "results"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("proposer_counts", json, nullable=True, comment=COMMENT))


def downgrade() -> None:
    for table in ("jobs", "results"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("proposer_counts")
