"""The pipeline (issue 13): a fencing epoch apart from the attempt budget, and what a job has queued.

- ``items.fence``: the fencing token, raised by every claim and never reset (``genjob retry`` resets
  ``attempts``, the budget, so a stale worker's late result can no longer pass as the current try's);
- ``jobs.queued_seq``: the items (by ``seq``, from 0) whose task messages were published, and
  ``jobs.queue_progress_at``: when the publisher last recorded progress; a sweeper finishes the
  queueing of a job whose publisher stopped (a submit killed mid-enqueue). Jobs already stored are
  taken as fully queued.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-12 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMMENTS = {
    (
        "items",
        "fence",
    ): "Fencing token: raised by every claim, never reset; only the holder of it may finish.",
    ("items", "attempts"): "Tries so far (the budget: genjob retry resets it; the fence is not).",
    ("jobs", "queued_seq"): "Items (by seq, from 0) whose task messages were published.",
    ("jobs", "queue_progress_at"): "When the publisher last recorded progress (a stopped one is taken over).",
}
OLD_ATTEMPTS_COMMENT = "Tries so far; the fencing token of the running try."
OUTCOME_COMMENT = "done, failed, retried, lost, superseded or released."
OLD_OUTCOME_COMMENT = "done, failed, retried, lost or superseded."


def _quoted(comment: str) -> str:
    return "'" + comment.replace("'", "''") + "'"


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column(
        "items",
        sa.Column(
            "fence", sa.BigInteger(), nullable=False, server_default="0", comment=COMMENTS[("items", "fence")]
        ),
    )
    op.execute("UPDATE items SET fence = attempts")
    op.add_column(
        "jobs",
        sa.Column(
            "queued_seq",
            sa.Integer(),
            nullable=False,
            server_default="0",
            comment=COMMENTS[("jobs", "queued_seq")],
        ),
    )
    op.add_column(
        "jobs",
        sa.Column(
            "queue_progress_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment=COMMENTS[("jobs", "queue_progress_at")],
        ),
    )
    op.execute("UPDATE jobs SET queued_seq = total")
    if postgres:
        op.execute(f"COMMENT ON COLUMN items.attempts IS {_quoted(COMMENTS[('items', 'attempts')])}")
        op.execute(f"COMMENT ON COLUMN attempts.outcome IS {_quoted(OUTCOME_COMMENT)}")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.drop_column("jobs", "queue_progress_at")
    op.drop_column("jobs", "queued_seq")
    op.drop_column("items", "fence")
    if postgres:
        op.execute(f"COMMENT ON COLUMN items.attempts IS {_quoted(OLD_ATTEMPTS_COMMENT)}")
        op.execute(f"COMMENT ON COLUMN attempts.outcome IS {_quoted(OLD_OUTCOME_COMMENT)}")
