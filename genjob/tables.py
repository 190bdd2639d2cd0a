"""SQLAlchemy models: jobs, their items (one per input line), results and attempts (the API's files,
batches and idempotency keys: ``genjob.file_tables``, re-exported here).

The schema is owned by Alembic (``migrations/``); nothing calls ``create_all`` outside the
tests of these models. Users query these tables and the ``job_stats`` view with psql: every column
carries a comment (psql's ``\\d+ jobs`` shows them), which Alembic writes to the database (``COMMENT ON``).
"""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from genjob.file_tables import Batch as Batch  # the API's tables, re-exported
from genjob.file_tables import File as File
from genjob.file_tables import FileChunk as FileChunk
from genjob.file_tables import IdempotencyKey as IdempotencyKey
from genjob.table_base import LOCAL_OWNER as LOCAL_OWNER
from genjob.table_base import Base as Base
from genjob.table_base import BigId, Json
from genjob.table_base import utcnow as utcnow

ROUNDS_BY_ROWS = (
    "Rounds by their row count B, flat keys B:field: rounds, seconds, output tokens, and of the plain "
    "rounds among them plain_rounds, plain_tokens, plain_seconds, plain_sq (the measured speedup)."
)
PROPOSER_COUNTS = (
    "Mode auto, per proposer: rounds it drafted for a row, tokens it proposed, accepted, rejections "
    "({'draft:rounds': n, 'draft:proposed': n, …})."
)


LOOPING = "The output ends in a loop: one short cycle of tokens repeated (a degenerate output)."


def shown(*, export: bool = False, openai: bool = False, export_digits: int | None = None) -> dict[str, Any]:
    """A result column's ``info``: where it is shown besides the table (``genjob.formats.result_fields``):
    ``export``, a column of the JSONL, CSV and Parquet exports (rounded to ``export_digits`` there);
    ``openai``, a member of the ``genjob`` object of an OpenAI response body."""
    return {"export": export, "openai": openai, "export_digits": export_digits}


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_owner_created_at", "owner", "created_at"),
        {"comment": "A submitted prompt file: its options, state, counters and engine sums."},
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, comment="Job id (12 hex digits).")
    name: Mapped[str | None] = mapped_column(String(200), comment="The name given at submit (--name).")
    status: Mapped[str] = mapped_column(
        String(16), index=True, comment="queued, running, completed, failed, cancelled or expired."
    )
    model: Mapped[str] = mapped_column(String(500), comment="Target model as the workers load it.")
    assistant: Mapped[str | None] = mapped_column(String(500), comment="Draft model (mode draft).")
    mode: Mapped[str] = mapped_column(String(16), comment="Decoding mode: draft, prompt-lookup or none.")
    queue: Mapped[str] = mapped_column(String(100), comment="Queue the job's chunks go to.")
    spec: Mapped[dict[str, Any]] = mapped_column(Json, comment="Generation options (genjob.options.JobSpec).")
    total: Mapped[int] = mapped_column(Integer, default=0, comment="Items (prompts) in the job.")
    done: Mapped[int] = mapped_column(Integer, default=0, comment="Items finished with a result.")
    failed: Mapped[int] = mapped_column(Integer, default=0, comment="Items failed for good.")
    error: Mapped[str | None] = mapped_column(Text, comment="Why the job failed or expired.")
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When it was submitted."
    )
    started_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="When a worker first took it."
    )
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), comment="When it ended.")
    expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="Deadline (--expire-after): then it ends expired."
    )
    # Aggregates over finished items, kept in step with item results (sums, not averages).
    new_tokens: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ new tokens of done items.")
    target_rounds: Mapped[int] = mapped_column(
        BigInteger, default=0, comment="Σ target forward passes of done items."
    )
    draft_proposed: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ draft tokens proposed.")
    draft_accepted: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ draft tokens accepted.")
    generate_seconds: Mapped[float] = mapped_column(
        Float, default=0.0, comment="Σ item latencies (each item's share of its batch's time)."
    )
    draft_rejections: Mapped[int] = mapped_column(
        BigInteger,
        default=0,
        comment="Rounds whose first refused draft was tested: α = accepted / (accepted + this).",
    )
    # What the workers' engines measured (sums over chunks): the rounds they ran, the plain probe
    # rounds among them (decoded without drafts, same batch: the measured speedup), the prefills.
    decode_rounds: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ decoding rounds.")
    decode_rows: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ batch size over rounds.")
    decode_tokens: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ tokens the rounds made.")
    decode_seconds: Mapped[float] = mapped_column(Float, default=0.0, comment="Σ seconds of the rounds.")
    probe_rounds: Mapped[int] = mapped_column(
        BigInteger, default=0, comment="Rounds decoded plainly to measure the speedup."
    )
    probe_tokens: Mapped[int] = mapped_column(BigInteger, default=0, comment="Σ tokens of probe rounds.")
    probe_seconds: Mapped[float] = mapped_column(Float, default=0.0, comment="Σ seconds of probe rounds.")
    probe_sq: Mapped[float] = mapped_column(Float, default=0.0, comment="Σ (probe round seconds per token)².")
    prefill_seconds: Mapped[float] = mapped_column(Float, default=0.0, comment="Σ seconds of prefills.")
    busy_seconds: Mapped[float] = mapped_column(
        Float, default=0.0, comment="Σ worker time on the job's chunks."
    )
    gamma_hist: Mapped[dict[str, int] | None] = mapped_column(Json, comment="Rounds by draft length k.")
    drafts_hist: Mapped[dict[str, int] | None] = mapped_column(
        Json, comment="Row-rounds by the drafts the row had (m ≤ k)."
    )
    proposer_counts: Mapped[dict[str, int] | None] = mapped_column(Json, comment=PROPOSER_COUNTS)
    rounds_by_rows: Mapped[dict[str, float] | None] = mapped_column(Json, comment=ROUNDS_BY_ROWS)
    costs: Mapped[dict[str, Any] | None] = mapped_column(
        Json, comment="Forward costs measured on a worker (ms)."
    )
    expected_speedup: Mapped[float | None] = mapped_column(
        Float, comment="Leviathan et al.'s expected speedup from α, γ and the measured costs."
    )
    lossless_checked: Mapped[int] = mapped_column(
        Integer, default=0, comment="Greedy items also decoded plainly."
    )
    lossless_matches: Mapped[int] = mapped_column(
        Integer, default=0, comment="Of those, items whose output matched the plain one."
    )
    cost_ratio: Mapped[float | None] = mapped_column(
        Float, comment="c = draft step / target step, mean batch."
    )
    last_draft_tokens: Mapped[int | None] = mapped_column(Integer, comment="γ: draft length last used.")
    model_revision: Mapped[str | None] = mapped_column(
        String(100), comment="The target's hub commit, or sha256 of its weight files (first worker)."
    )
    assistant_revision: Mapped[str | None] = mapped_column(
        String(100), comment="The draft's hub commit, or sha256 of its weight files."
    )
    versions: Mapped[dict[str, str] | None] = mapped_column(
        Json, comment="Library versions of the first worker that ran it (python, torch, transformers…)."
    )
    queued_seq: Mapped[int] = mapped_column(
        Integer,
        default=0,
        server_default="0",
        comment="Items (by seq, from 0) whose task messages were published.",
    )
    queue_progress_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True),
        comment="When the publisher last recorded progress (a stopped one is taken over).",
    )
    owner: Mapped[str] = mapped_column(
        String(100),
        default=LOCAL_OWNER,
        server_default=LOCAL_OWNER,
        comment="Who submitted it: the API key's owner id (key-…), or local (the CLI).",
    )
    model_name: Mapped[str | None] = mapped_column(
        String(500), comment="The target as the submitter named it (allow-list name): shown instead of paths."
    )
    assistant_name: Mapped[str | None] = mapped_column(
        String(500), comment="The draft as the submitter named it (allow-list name)."
    )


class Item(Base):
    """One input line of a job. ``seq`` is its position among the file's prompts (input order)."""

    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("job_id", "seq"),
        UniqueConstraint("job_id", "custom_id"),
        Index("ix_items_job_id_status", "job_id", "status"),
        Index("ix_items_lease_expires_at", "lease_expires_at"),
        {"comment": "One prompt (input line) of a job."},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True, comment="Item id.")
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), comment="Its job.")
    seq: Mapped[int] = mapped_column(Integer, comment="Position among the file's prompts, from 0.")
    line: Mapped[int] = mapped_column(Integer, comment="Line number in the submitted file.")
    custom_id: Mapped[str | None] = mapped_column(String(200), comment="The line's id (custom_id).")
    prompt: Mapped[str] = mapped_column(Text, comment="Prompt text (chat messages rendered at submit).")
    max_new_tokens: Mapped[int | None] = mapped_column(
        Integer, comment="The line's own limit; null: the job's."
    )
    status: Mapped[str] = mapped_column(
        String(16), default="pending", comment="pending, running, done, failed, cancelled or expired."
    )
    attempts: Mapped[int] = mapped_column(
        Integer, default=0, comment="Tries so far (the budget: genjob retry resets it; the fence is not)."
    )
    fence: Mapped[int] = mapped_column(
        BigInteger,
        default=0,
        server_default="0",
        comment="Fencing token: raised by every claim, never reset; only the holder of it may finish.",
    )
    error: Mapped[str | None] = mapped_column(Text, comment="Last error.")
    started_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="When its last try started."
    )
    finished_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="When it became final."
    )
    # The lease: the worker process that holds the item (queued to it or running there) and until
    # when; renewed while it lives, taken back by the sweeper once it runs out. ``fence`` is the
    # fencing token: only the claim that raised it last may finish the item.
    claimed_by: Mapped[str | None] = mapped_column(
        String(200), comment="Worker process holding its lease (host/pid)."
    )
    lease_expires_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="Lease end; after it the sweeper takes the item back."
    )
    # The line's own sampling settings (OpenAI request lines); null: the job's.
    temperature: Mapped[float | None] = mapped_column(
        Float, comment="The line's temperature; null: the job's."
    )
    top_p: Mapped[float | None] = mapped_column(Float, comment="The line's top_p; null: the job's.")
    seed: Mapped[int | None] = mapped_column(
        BigInteger, comment="The line's seed (used as is); null: the job's seed + seq."
    )
    stop: Mapped[list[str] | None] = mapped_column(
        Json, comment="The line's stop strings: output ends before the first one."
    )


class Result(Base):
    """The output of one finished item; unique per (job, item) so redelivered chunks upsert."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("job_id", "item_id"),
        {"comment": "The output of a done item, with its decoding measurements."},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True, comment="Result id.")
    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True, comment="Its job."
    )
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), comment="Its item.")
    output: Mapped[str] = mapped_column(Text, comment="Generated text.", info=shown(export=True))
    finish_reason: Mapped[str] = mapped_column(
        String(16), comment="'length' or 'stop' (EOS).", info=shown(export=True)
    )
    mode: Mapped[str] = mapped_column(
        String(16), comment="Decoding mode actually used.", info=shown(export=True, openai=True)
    )
    prompt_tokens: Mapped[int] = mapped_column(
        Integer, comment="Tokens of the prompt.", info=shown(export=True)
    )
    new_tokens: Mapped[int] = mapped_column(Integer, comment="Tokens generated.", info=shown(export=True))
    target_rounds: Mapped[int] = mapped_column(
        Integer, comment="Target forward passes (verification rounds).", info=shown(export=True, openai=True)
    )
    draft_proposed: Mapped[int] = mapped_column(
        Integer, comment="Draft tokens proposed.", info=shown(export=True, openai=True)
    )
    draft_accepted: Mapped[int] = mapped_column(
        Integer, comment="Draft tokens accepted.", info=shown(export=True, openai=True)
    )
    draft_rejections: Mapped[int] = mapped_column(
        Integer, default=0, comment="Rounds ended by a refused draft token.", info=shown(openai=True)
    )
    gamma_mean: Mapped[float | None] = mapped_column(
        Float, comment="Mean draft length of its rounds.", info=shown(openai=True)
    )
    latency_s: Mapped[float] = mapped_column(
        Float,
        comment="Its share of its batch's time (seconds).",
        info=shown(export=True, openai=True, export_digits=6),
    )
    lossless_match: Mapped[bool | None] = mapped_column(
        Boolean, comment="Sampled greedy items: output == the same item decoded without drafts."
    )
    worker: Mapped[str | None] = mapped_column(String(200), comment="Worker that produced it.")
    proposer_counts: Mapped[dict[str, int] | None] = mapped_column(Json, comment=PROPOSER_COUNTS)
    looping: Mapped[bool | None] = mapped_column(
        Boolean, comment=LOOPING, info=shown(export=True, openai=True)
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When it was written."
    )


# What a worker writes of an item (``genjob.worker.runners.result_row``): all result columns but these.
_NOT_WRITTEN = ("id", "job_id", "item_id", "created_at")
RESULT_FIELDS = tuple(column.name for column in Result.__table__.columns if column.name not in _NOT_WRITTEN)


class Attempt(Base):
    """One try of one item by one worker: lets us prove no two attempts overlap in time."""

    __tablename__ = "attempts"
    __table_args__ = ({"comment": "One try of one item by one worker process."},)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True, comment="Attempt id.")
    job_id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), index=True, comment="The item's job."
    )
    item_id: Mapped[int] = mapped_column(
        ForeignKey("items.id", ondelete="CASCADE"), index=True, comment="The item tried."
    )
    worker: Mapped[str | None] = mapped_column(String(200), comment="Worker process (host/pid).")
    started_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, comment="When the try started."
    )
    finished_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), comment="When it ended; null while it runs."
    )
    outcome: Mapped[str | None] = mapped_column(
        String(16), comment="done, failed, retried, lost, superseded, released or stopped."
    )
    error: Mapped[str | None] = mapped_column(Text, comment="Its error.")
