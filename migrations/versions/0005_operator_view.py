"""The operator's view (issue 15): jsonb, attempts.job_id, every column commented, provenance on jobs.

- ``jobs.spec``, ``gamma_hist`` and ``costs`` become ``jsonb`` on Postgres;
- ``attempts`` gains ``job_id`` (filled from its item) with an index, so a job's tries are one lookup;
- ``jobs`` gains the revisions of its models and the library versions of the worker that ran it;
- ``job_stats`` gains the job's elapsed time and tokens/s over it (started → finished, or now while
  running) beside the decode-only tokens/s, and shows the lossless rate only for greedy jobs;
- every table, column and view column gets a comment (``COMMENT ON``; Postgres only: SQLite keeps none).

The comments are frozen here as they were written for this revision.

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_COLUMNS = ("spec", "gamma_hist", "costs")
NEW_COLUMNS = {"jobs": {"model_revision", "assistant_revision", "versions"}, "attempts": {"job_id"}}

TABLE_COMMENTS = {
    "jobs": "A submitted prompt file: its options, state, counters and engine sums.",
    "items": "One prompt (input line) of a job.",
    "attempts": "One try of one item by one worker process.",
    "results": "The output of a done item, with its decoding measurements.",
}

COLUMN_COMMENTS = {
    "jobs": {
        "id": "Job id (12 hex digits).",
        "name": "The name given at submit (--name).",
        "status": "queued, running, completed, failed, cancelled or expired.",
        "model": "Target model as the workers load it.",
        "assistant": "Draft model (mode draft).",
        "mode": "Decoding mode: draft, prompt-lookup or none.",
        "queue": "Queue the job's chunks go to.",
        "spec": "Generation options (genjob.options.JobSpec).",
        "total": "Items (prompts) in the job.",
        "done": "Items finished with a result.",
        "failed": "Items failed for good.",
        "error": "Why the job failed or expired.",
        "created_at": "When it was submitted.",
        "started_at": "When a worker first took it.",
        "finished_at": "When it ended.",
        "expires_at": "Deadline (--expire-after): then it ends expired.",
        "new_tokens": "Σ new tokens of done items.",
        "target_rounds": "Σ target forward passes of done items.",
        "draft_proposed": "Σ draft tokens proposed.",
        "draft_accepted": "Σ draft tokens accepted.",
        "generate_seconds": "Σ item latencies (each item's share of its batch's time).",
        "draft_rejections": "Rounds whose first refused draft was tested: α = accepted / (accepted + this).",
        "decode_rounds": "Σ decoding rounds.",
        "decode_rows": "Σ batch size over rounds.",
        "decode_tokens": "Σ tokens the rounds made.",
        "decode_seconds": "Σ seconds of the rounds.",
        "probe_rounds": "Rounds decoded plainly to measure the speedup.",
        "probe_tokens": "Σ tokens of probe rounds.",
        "probe_seconds": "Σ seconds of probe rounds.",
        "probe_sq": "Σ (probe round seconds per token)².",
        "prefill_seconds": "Σ seconds of prefills.",
        "busy_seconds": "Σ worker time on the job's chunks.",
        "gamma_hist": "Rounds by draft length k.",
        "costs": "Forward costs measured on a worker (ms).",
        "expected_speedup": "Leviathan et al.'s expected speedup from α, γ and the measured costs.",
        "lossless_checked": "Greedy items also decoded plainly.",
        "lossless_matches": "Of those, items whose output matched the plain one.",
        "cost_ratio": "c = draft step / target step, mean batch.",
        "draft_tokens": "γ: draft length last used.",
        "model_revision": "The target's hub commit, or sha256 of its weight files (first worker).",
        "assistant_revision": "The draft's hub commit, or sha256 of its weight files.",
        "versions": "Library versions of the first worker that ran it (python, torch, transformers…).",
    },
    "items": {
        "id": "Item id.",
        "job_id": "Its job.",
        "seq": "Position among the file's prompts, from 0.",
        "line": "Line number in the submitted file.",
        "custom_id": "The line's id (custom_id).",
        "prompt": "Prompt text (chat messages rendered at submit).",
        "max_new_tokens": "The line's own limit; null: the job's.",
        "status": "pending, running, done, failed, cancelled or expired.",
        "attempts": "Tries so far; the fencing token of the running try.",
        "error": "Last error.",
        "started_at": "When its last try started.",
        "finished_at": "When it became final.",
        "claimed_by": "Worker process holding its lease (host/pid).",
        "lease_expires_at": "Lease end; after it the sweeper takes the item back.",
    },
    "attempts": {
        "id": "Attempt id.",
        "job_id": "The item's job.",
        "item_id": "The item tried.",
        "worker": "Worker process (host/pid).",
        "started_at": "When the try started.",
        "finished_at": "When it ended; null while it runs.",
        "outcome": "done, failed, retried, lost or superseded.",
        "error": "Its error.",
    },
    "results": {
        "id": "Result id.",
        "job_id": "Its job.",
        "item_id": "Its item.",
        "output": "Generated text.",
        "finish_reason": "'length' or 'stop' (EOS).",
        "mode": "Decoding mode actually used.",
        "prompt_tokens": "Tokens of the prompt.",
        "new_tokens": "Tokens generated.",
        "target_rounds": "Target forward passes (verification rounds).",
        "draft_proposed": "Draft tokens proposed.",
        "draft_accepted": "Draft tokens accepted.",
        "draft_rejections": "Rounds ended by a refused draft token.",
        "gamma_mean": "Mean draft length of its rounds.",
        "latency_s": "Its share of its batch's time (seconds).",
        "lossless_match": "Sampled greedy items: output == the same item decoded without drafts.",
        "worker": "Worker that produced it.",
        "created_at": "When it was written.",
    },
}

VIEW_COMMENTS = {
    "job_id": "Job id.",
    "name": "The name given at submit.",
    "status": "queued, running, completed, failed, cancelled or expired.",
    "mode": "Decoding mode: draft, prompt-lookup or none.",
    "total": "Items in the job.",
    "done": "Items finished with a result.",
    "failed": "Items failed for good.",
    "new_tokens": "Σ new tokens of done items.",
    "target_rounds": "Σ target forward passes of done items.",
    "draft_proposed": "Σ draft tokens proposed.",
    "draft_accepted": "Σ draft tokens accepted.",
    "draft_rejections": "Rounds ended by a refused draft token.",
    "generate_seconds": "Σ item latencies (each item's share of its batch's time).",
    "acceptance_rate": "Draft tokens accepted / proposed.",
    "alpha": "Per-token α: accepted / (accepted + rejections).",
    "mean_accepted_per_round": "Draft tokens accepted per target round.",
    "tokens_per_second": "New tokens / Σ item latencies: decoding throughput, queueing and gaps left out.",
    "started_at": "When a worker first took the job.",
    "finished_at": "When it ended.",
    "elapsed_seconds": "started → finished (→ now while it runs).",
    "elapsed_tokens_per_second": "New tokens / elapsed seconds: what the job really delivered.",
    "mean_batch_size": "Mean rows per decoding round.",
    "probe_rounds": "Rounds decoded plainly to measure the speedup.",
    "measured_speedup": "Tokens/s ÷ plain tokens/s at the same batch size, from the probe rounds.",
    "expected_speedup": "Leviathan et al.'s expected speedup from α, γ and the measured costs.",
    "lossless_rate": "Greedy jobs only: share of checked items whose output matched plain decoding.",
    "cost_ratio": "c = draft step / target step.",
    "draft_tokens": "γ: draft length last used.",
    "model_revision": "The target's hub commit or weights hash.",
}

VIEW = """
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
    started_at, finished_at,
    {elapsed} AS elapsed_seconds,
    CASE WHEN {elapsed} > 0 THEN new_tokens / {elapsed} END AS elapsed_tokens_per_second,
    CASE WHEN decode_rounds > 0 THEN CAST(decode_rows AS FLOAT) / decode_rounds END AS mean_batch_size,
    probe_rounds,
    CASE WHEN probe_tokens > 0 AND busy_seconds > 0
        THEN (busy_seconds - decode_seconds + decode_tokens * probe_seconds / probe_tokens) / busy_seconds
        END AS measured_speedup,
    expected_speedup,
    CASE WHEN lossless_checked > 0 AND {greedy}
        THEN CAST(lossless_matches AS FLOAT) / lossless_checked END AS lossless_rate,
    cost_ratio, draft_tokens, model_revision
FROM jobs
"""
ELAPSED = {
    "postgresql": "EXTRACT(EPOCH FROM (COALESCE(finished_at, now()) - started_at))",
    "sqlite": "(julianday(COALESCE(finished_at, 'now')) - julianday(started_at)) * 86400.0",
}
GREEDY = {
    "postgresql": "COALESCE((spec->>'temperature')::float, 0) = 0",
    "sqlite": "COALESCE(json_extract(spec, '$.temperature'), 0) = 0",
}

# The view of revision 0003, restored by the downgrade.
OLD_VIEW = """
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


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _comment_everything() -> None:
    for table, comment in TABLE_COMMENTS.items():
        op.execute(f"COMMENT ON TABLE {table} IS {_quoted(comment)}")
    for table, columns in COLUMN_COMMENTS.items():
        for column, comment in columns.items():
            op.execute(f"COMMENT ON COLUMN {table}.{column} IS {_quoted(comment)}")
    op.execute("COMMENT ON VIEW job_stats IS 'Per job: counts, acceptance, throughput and speedups.'")
    for column, comment in VIEW_COMMENTS.items():
        op.execute(f"COMMENT ON COLUMN job_stats.{column} IS {_quoted(comment)}")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    postgres = dialect == "postgresql"
    op.execute("DROP VIEW job_stats")
    json_type = postgresql.JSONB() if postgres else sa.JSON()
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_revision", sa.String(100), nullable=True))
        batch_op.add_column(sa.Column("assistant_revision", sa.String(100), nullable=True))
        batch_op.add_column(sa.Column("versions", json_type, nullable=True))
    if postgres:
        for column in JSON_COLUMNS:
            op.execute(f"ALTER TABLE jobs ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb")
    op.add_column("attempts", sa.Column("job_id", sa.String(32), nullable=True))
    op.execute(
        "UPDATE attempts SET job_id = (SELECT items.job_id FROM items WHERE items.id = attempts.item_id)"
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.alter_column("job_id", existing_type=sa.String(32), nullable=False)
        batch_op.create_foreign_key("fk_attempts_job_id_jobs", "jobs", ["job_id"], ["id"], ondelete="CASCADE")
        batch_op.create_index("ix_attempts_job_id", ["job_id"])
    op.execute(VIEW.format(elapsed=ELAPSED[dialect], greedy=GREEDY[dialect]))
    if postgres:
        _comment_everything()


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    postgres = dialect == "postgresql"
    op.execute("DROP VIEW job_stats")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_job_id")
        batch_op.drop_constraint("fk_attempts_job_id_jobs", type_="foreignkey")
        batch_op.drop_column("job_id")
    if postgres:
        for column in JSON_COLUMNS:
            op.execute(f"ALTER TABLE jobs ALTER COLUMN {column} TYPE json USING {column}::json")
        for table, columns in COLUMN_COMMENTS.items():
            op.execute(f"COMMENT ON TABLE {table} IS NULL")
            for column in set(columns) - NEW_COLUMNS.get(table, set()):
                op.execute(f"COMMENT ON COLUMN {table}.{column} IS NULL")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("versions")
        batch_op.drop_column("assistant_revision")
        batch_op.drop_column("model_revision")
    op.execute(OLD_VIEW)
