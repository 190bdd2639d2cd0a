"""A try stopped with its job (issue 27): ``attempts.outcome`` may be ``stopped``.

A cancelled or expired job's rows in flight leave the decode batch at the next check instead of
running to their end; their items end as the job did and their tries are recorded ``stopped``. The
column is a string already: only its comment changes (Postgres keeps comments; SQLite has none).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 04:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OUTCOME_COMMENT = "done, failed, retried, lost, superseded, released or stopped."
OLD_OUTCOME_COMMENT = "done, failed, retried, lost, superseded or released."


def _comment(comment: str) -> None:
    if op.get_bind().dialect.name == "postgresql":
        quoted = "'" + comment.replace("'", "''") + "'"
        op.execute(f"COMMENT ON COLUMN attempts.outcome IS {quoted}")


def upgrade() -> None:
    _comment(OUTCOME_COMMENT)


def downgrade() -> None:
    _comment(OLD_OUTCOME_COMMENT)
