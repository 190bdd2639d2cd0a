"""A result says whether its output ends in a loop (issue 25): ``results.looping``.

One short cycle of tokens repeated to the end of the output (``genjob.generation.loops``): a flag a
user filters on to find degenerate rows, not an error. Null on results written before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 04:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENT = "The output ends in a loop: one short cycle of tokens repeated (a degenerate output)."


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("looping", sa.Boolean(), nullable=True, comment=COMMENT))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("looping")
