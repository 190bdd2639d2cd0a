"""Initial schema: jobs, items, results, attempts and the job_stats view.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 14:44:10.407202
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


JOB_STATS_VIEW = """
CREATE VIEW job_stats AS
SELECT
    id AS job_id, name, status, mode, total, done, failed,
    new_tokens, target_rounds, draft_proposed, draft_accepted, generate_seconds,
    CASE WHEN draft_proposed > 0 THEN CAST(draft_accepted AS FLOAT) / draft_proposed END AS acceptance_rate,
    CASE WHEN target_rounds > 0 THEN CAST(draft_accepted AS FLOAT) / target_rounds END
        AS mean_accepted_per_round,
    CASE WHEN generate_seconds > 0 THEN new_tokens / generate_seconds END AS tokens_per_second,
    baseline_items,
    CASE WHEN baseline_assisted_seconds > 0 THEN baseline_seconds / baseline_assisted_seconds END
        AS measured_speedup,
    CASE WHEN baseline_items > 0 THEN CAST(baseline_matches AS FLOAT) / baseline_items END AS lossless_rate,
    cost_ratio, draft_tokens, guard_tripped, guard_reason
FROM jobs
"""


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("assistant", sa.String(length=500), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("new_tokens", sa.BigInteger(), nullable=False),
        sa.Column("target_rounds", sa.BigInteger(), nullable=False),
        sa.Column("draft_proposed", sa.BigInteger(), nullable=False),
        sa.Column("draft_accepted", sa.BigInteger(), nullable=False),
        sa.Column("generate_seconds", sa.Float(), nullable=False),
        sa.Column("baseline_items", sa.Integer(), nullable=False),
        sa.Column("baseline_seconds", sa.Float(), nullable=False),
        sa.Column("baseline_assisted_seconds", sa.Float(), nullable=False),
        sa.Column("baseline_matches", sa.Integer(), nullable=False),
        sa.Column("cost_ratio", sa.Float(), nullable=True),
        sa.Column("draft_tokens", sa.Integer(), nullable=True),
        sa.Column("guard_tripped", sa.Boolean(), nullable=False),
        sa.Column("guard_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_status"), ["status"], unique=False)

    op.create_table(
        "items",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", sa.String(length=200), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("max_new_tokens", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_items_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_items")),
        sa.UniqueConstraint("job_id", "custom_id", name=op.f("uq_items_job_id_custom_id")),
        sa.UniqueConstraint("job_id", "seq", name=op.f("uq_items_job_id_seq")),
    )
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.create_index("ix_items_job_id_status", ["job_id", "status"], unique=False)

    op.create_table(
        "attempts",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["item_id"], ["items.id"], name=op.f("fk_attempts_item_id_items"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_item_id"), ["item_id"], unique=False)

    op.create_table(
        "results",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False
        ),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("new_tokens", sa.Integer(), nullable=False),
        sa.Column("target_rounds", sa.Integer(), nullable=False),
        sa.Column("draft_proposed", sa.Integer(), nullable=False),
        sa.Column("draft_accepted", sa.Integer(), nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("baseline_latency_s", sa.Float(), nullable=True),
        sa.Column("baseline_match", sa.Boolean(), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["item_id"], ["items.id"], name=op.f("fk_results_item_id_items"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_results_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint("job_id", "item_id", name=op.f("uq_results_job_id_item_id")),
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_results_job_id"), ["job_id"], unique=False)

    op.execute(JOB_STATS_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW job_stats")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_results_job_id"))

    op.drop_table("results")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_item_id"))

    op.drop_table("attempts")
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_index("ix_items_job_id_status")

    op.drop_table("items")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_status"))

    op.drop_table("jobs")
