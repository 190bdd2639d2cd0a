"""One speculative engine (issue 12): per-job engine measurements replace the A/B and the speedup guard.

Jobs gain the sums the workers' engines measure (rounds, plain probe rounds, prefill, busy time),
the γ histogram, the measured costs, α's rejections and the lossless check; results gain each item's
rejections and mean γ. The per-item A/B columns and the speedup guard go. job_stats is rebuilt.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:00:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_JOB_STATS_VIEW = """
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

# measured_speedup: plain tokens/s ÷ the job's tokens/s at the same batch size, same workers: the
# plain probe rounds' seconds per token, times every decoded token, stands in for the decode time.
JOB_STATS_VIEW = """
CREATE VIEW job_stats AS
SELECT
    id AS job_id, name, status, mode, total, done, failed,
    new_tokens, target_rounds, draft_proposed, draft_accepted, draft_rejections, generate_seconds,
    CASE WHEN draft_proposed > 0 THEN CAST(draft_accepted AS FLOAT) / draft_proposed END AS acceptance_rate,
    CASE WHEN draft_accepted + draft_rejections > 0
        THEN CAST(draft_accepted AS FLOAT) / (draft_accepted + draft_rejections) END AS alpha,
    CASE WHEN target_rounds > 0 THEN CAST(draft_accepted AS FLOAT) / target_rounds END
        AS mean_accepted_per_round,
    CASE WHEN generate_seconds > 0 THEN new_tokens / generate_seconds END AS tokens_per_second,
    CASE WHEN decode_rounds > 0 THEN CAST(decode_rows AS FLOAT) / decode_rounds END AS mean_batch_size,
    probe_rounds,
    CASE WHEN probe_tokens > 0 AND busy_seconds > 0
        THEN (busy_seconds - decode_seconds + decode_tokens * probe_seconds / probe_tokens) / busy_seconds
        END AS measured_speedup,
    expected_speedup,
    CASE WHEN lossless_checked > 0
        THEN CAST(lossless_matches AS FLOAT) / lossless_checked END AS lossless_rate,
    cost_ratio, draft_tokens
FROM jobs
"""

JOB_COLUMNS: list[tuple[str, Any, Any]] = [
    ("draft_rejections", sa.BigInteger(), "0"),
    ("decode_rounds", sa.BigInteger(), "0"),
    ("decode_rows", sa.BigInteger(), "0"),
    ("decode_tokens", sa.BigInteger(), "0"),
    ("decode_seconds", sa.Float(), "0"),
    ("probe_rounds", sa.BigInteger(), "0"),
    ("probe_tokens", sa.BigInteger(), "0"),
    ("probe_seconds", sa.Float(), "0"),
    ("probe_sq", sa.Float(), "0"),
    ("prefill_seconds", sa.Float(), "0"),
    ("busy_seconds", sa.Float(), "0"),
    ("lossless_checked", sa.Integer(), "0"),
    ("lossless_matches", sa.Integer(), "0"),
]
OLD_JOB_COLUMNS: list[tuple[str, Any, Any]] = [
    ("baseline_items", sa.Integer(), "0"),
    ("baseline_seconds", sa.Float(), "0"),
    ("baseline_assisted_seconds", sa.Float(), "0"),
    ("baseline_matches", sa.Integer(), "0"),
    ("guard_tripped", sa.Boolean(), sa.false()),
]


def upgrade() -> None:
    op.execute("DROP VIEW job_stats")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, kind, default in JOB_COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=False, server_default=default))
        batch_op.add_column(sa.Column("gamma_hist", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("costs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("expected_speedup", sa.Float(), nullable=True))
        for name, _, _ in OLD_JOB_COLUMNS:
            batch_op.drop_column(name)
        batch_op.drop_column("guard_reason")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("draft_rejections", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("gamma_mean", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("lossless_match", sa.Boolean(), nullable=True))
        batch_op.drop_column("baseline_latency_s")
        batch_op.drop_column("baseline_match")
    op.execute(JOB_STATS_VIEW)


def downgrade() -> None:
    op.execute("DROP VIEW job_stats")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("baseline_match", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("baseline_latency_s", sa.Float(), nullable=True))
        batch_op.drop_column("lossless_match")
        batch_op.drop_column("gamma_mean")
        batch_op.drop_column("draft_rejections")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, kind, default in OLD_JOB_COLUMNS:
            batch_op.add_column(sa.Column(name, kind, nullable=False, server_default=default))
        batch_op.add_column(sa.Column("guard_reason", sa.Text(), nullable=True))
        for name in ("expected_speedup", "costs", "gamma_hist", *(c[0] for c in JOB_COLUMNS)):
            batch_op.drop_column(name)
    op.execute(OLD_JOB_STATS_VIEW)
