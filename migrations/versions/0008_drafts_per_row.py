"""Drafts per row (issue 12): ``jobs.drafts_hist``, row-rounds by the drafts the row had.

A round drafts k tokens for the batch, but a row can have fewer: prompt lookup finds fewer than k (or
none) for many rows, and a row near its max_new_tokens can use fewer. The expected speedup counts each
row's own number of drafts (``genjob.generation.costs.expected_speedup``), so the histogram is kept
beside ``gamma_hist`` (rounds by k), and users can redo the figure by hand.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column(
                "drafts_hist",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                nullable=True,
                comment="Row-rounds by the drafts the row had (m ≤ k).",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("drafts_hist")
