"""One name per meaning for γ (issue 43): ``jobs.draft_tokens`` becomes ``jobs.last_draft_tokens``.

``draft_tokens`` is the job option, the most draft tokens a round proposes (γmax, in the job's spec);
the column holds another thing, the draft length the engine ended the job's last chunk with. The
``job_stats`` view (revision 0011's) shows it under the new name too. A rename in place, in the words
Postgres and SQLite (3.25 and later) share: not ``batch_alter_table``, whose copy of the table on SQLite
would drop ``jobs`` under the items that reference it (foreign keys are on); the view that reads the
column is dropped first and made again after.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 20:00:00.000000
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_NAME, NEW_NAME = "draft_tokens", "last_draft_tokens"


def _revision(number: str, name: str) -> ModuleType:
    """Revision ``number`` (file ``name``), whose view this revision builds on."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"genjob_revision_{number}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _create_view(column: str) -> None:
    """Revision 0011's job_stats view, with the last draft length read from ``column``."""
    base, counts = _revision("0005", "0005_operator_view.py"), _revision("0011", "0011_proposer_counts.py")
    dialect = op.get_bind().dialect.name
    view = base.VIEW.format(elapsed=base.ELAPSED[dialect], greedy=base.GREEDY[dialect])
    with_counts = counts.LAST_COLUMNS.replace("model_revision", "model_revision, proposer_counts")
    assert counts.LAST_COLUMNS in view, "revision 0005's view ends otherwise: extend it by hand"
    view = view.replace(counts.LAST_COLUMNS, with_counts.replace(OLD_NAME, column))
    op.execute(view)
    if dialect == "postgresql":
        op.execute("COMMENT ON VIEW job_stats IS 'Per job: counts, acceptance, throughput and speedups.'")
        comments = {**base.VIEW_COMMENTS, "proposer_counts": counts.COMMENT}
        comments[column] = comments.pop(OLD_NAME)
        for name, comment in comments.items():
            quoted = "'" + comment.replace("'", "''") + "'"
            op.execute(f"COMMENT ON COLUMN job_stats.{name} IS {quoted}")


def _rename(old: str, new: str) -> None:
    op.execute("DROP VIEW job_stats")
    op.execute(f"ALTER TABLE jobs RENAME COLUMN {old} TO {new}")  # the same words in both dialects
    _create_view(new)


def upgrade() -> None:
    _rename(OLD_NAME, NEW_NAME)


def downgrade() -> None:
    _rename(NEW_NAME, OLD_NAME)
