"""Mode auto's per-proposer counts (issue 25): ``jobs.proposer_counts`` and ``results.proposer_counts``.

A job in mode auto drafts each row, each round, from whichever of its proposers pays (prompt lookup,
the job's suffix cache, the draft model): per proposer, the rounds it drafted for a row, the tokens it
proposed, those accepted and the rejections, flat keys ``name:field``; per item on its result, and
summed per job as its chunks end. The ``job_stats`` view shows the job's (revision 0005's view, which
this one builds on, plus that column).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 04:00:00.000000
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

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


LAST_COLUMNS = "cost_ratio, draft_tokens, model_revision\nFROM jobs"


def _revision_0005() -> ModuleType:
    """Revision 0005, whose job_stats view (and its column comments) this revision extends."""
    path = Path(__file__).with_name("0005_operator_view.py")
    spec = importlib.util.spec_from_file_location("genjob_revision_0005", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _create_view(with_counts: bool) -> None:
    base, dialect = _revision_0005(), op.get_bind().dialect.name
    view = base.VIEW.format(elapsed=base.ELAPSED[dialect], greedy=base.GREEDY[dialect])
    if with_counts:
        assert LAST_COLUMNS in view, "revision 0005's view ends otherwise: extend it by hand"
        view = view.replace(
            LAST_COLUMNS, LAST_COLUMNS.replace("model_revision", "model_revision, proposer_counts")
        )
    op.execute(view)
    if dialect == "postgresql":
        op.execute("COMMENT ON VIEW job_stats IS 'Per job: counts, acceptance, throughput and speedups.'")
        comments = {**base.VIEW_COMMENTS, **({"proposer_counts": COMMENT} if with_counts else {})}
        for column, comment in comments.items():
            quoted = "'" + comment.replace("'", "''") + "'"
            op.execute(f"COMMENT ON COLUMN job_stats.{column} IS {quoted}")


def upgrade() -> None:
    json = sa.JSON().with_variant(JSONB(), "postgresql")
    op.execute("DROP VIEW job_stats")
    for table in ("jobs", "results"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("proposer_counts", json, nullable=True, comment=COMMENT))
    _create_view(with_counts=True)


def downgrade() -> None:
    op.execute("DROP VIEW job_stats")
    for table in ("jobs", "results"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("proposer_counts")
    _create_view(with_counts=False)
