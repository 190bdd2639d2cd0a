"""SQLAlchemy models: jobs, their items (one per input line), results and attempts.

The schema is owned by Alembic (``migrations/``); nothing calls ``create_all`` outside the
tests of these models. Users query these tables and the ``job_stats`` view with psql.
"""

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY, not BIGINT.
BigId = BigInteger().with_variant(Integer, "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str] = mapped_column(String(500))
    assistant: Mapped[str | None] = mapped_column(String(500))
    mode: Mapped[str] = mapped_column(String(16))
    queue: Mapped[str] = mapped_column(String(100))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, doc="Generation options (genjob.options.JobSpec).")
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Aggregates over finished items, kept in step with item results (sums, not averages).
    new_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    target_rounds: Mapped[int] = mapped_column(BigInteger, default=0)
    draft_proposed: Mapped[int] = mapped_column(BigInteger, default=0)
    draft_accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    generate_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    draft_rejections: Mapped[int] = mapped_column(
        BigInteger,
        default=0,
        doc="Rounds whose first refused draft was tested: α = accepted / (accepted + this).",
    )
    # What the workers' engines measured (sums over chunks): the rounds they ran, the plain probe
    # rounds among them (decoded without drafts, same batch: the measured speedup), the prefills.
    decode_rounds: Mapped[int] = mapped_column(BigInteger, default=0)
    decode_rows: Mapped[int] = mapped_column(BigInteger, default=0, doc="Σ batch size over rounds.")
    decode_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    decode_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    probe_rounds: Mapped[int] = mapped_column(BigInteger, default=0)
    probe_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    probe_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    probe_sq: Mapped[float] = mapped_column(Float, default=0.0, doc="Σ (probe round seconds per token)².")
    prefill_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0, doc="Σ worker time on the job's chunks.")
    gamma_hist: Mapped[dict[str, int] | None] = mapped_column(JSON, doc="Rounds by draft length k.")
    costs: Mapped[dict[str, Any] | None] = mapped_column(JSON, doc="Forward costs measured on a worker.")
    expected_speedup: Mapped[float | None] = mapped_column(Float)
    lossless_checked: Mapped[int] = mapped_column(Integer, default=0, doc="Items also decoded plainly.")
    lossless_matches: Mapped[int] = mapped_column(Integer, default=0)
    cost_ratio: Mapped[float | None] = mapped_column(Float, doc="c = draft step / target step, mean batch.")
    draft_tokens: Mapped[int | None] = mapped_column(Integer, doc="γ: draft length last used.")


class Item(Base):
    """One input line of a job. ``seq`` is its position among the file's prompts (input order)."""

    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("job_id", "seq"),
        UniqueConstraint("job_id", "custom_id"),
        Index("ix_items_job_id_status", "job_id", "status"),
        Index("ix_items_lease_expires_at", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    line: Mapped[int] = mapped_column(Integer, doc="Line number in the submitted file.")
    custom_id: Mapped[str | None] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The lease: the worker process that holds the item (queued to it or running there) and until
    # when; renewed while it lives, taken back by the sweeper once it runs out. ``attempts`` is
    # the fencing token: only the attempt that claimed the item last may finish it.
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Result(Base):
    """The output of one finished item; unique per (job, item) so redelivered chunks upsert."""

    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("job_id", "item_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    output: Mapped[str] = mapped_column(Text)
    finish_reason: Mapped[str] = mapped_column(String(16), doc="'length' or 'stop' (EOS).")
    mode: Mapped[str] = mapped_column(String(16), doc="Decoding mode actually used.")
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    new_tokens: Mapped[int] = mapped_column(Integer)
    target_rounds: Mapped[int] = mapped_column(Integer, doc="Target forward passes (verification rounds).")
    draft_proposed: Mapped[int] = mapped_column(Integer)
    draft_accepted: Mapped[int] = mapped_column(Integer)
    draft_rejections: Mapped[int] = mapped_column(Integer, default=0)
    gamma_mean: Mapped[float | None] = mapped_column(Float, doc="Mean draft length of its rounds.")
    latency_s: Mapped[float] = mapped_column(Float)
    lossless_match: Mapped[bool | None] = mapped_column(
        Boolean, doc="Sampled greedy items: output == the same item decoded without drafts."
    )
    worker: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Attempt(Base):
    """One try of one item by one worker: lets us prove no two attempts overlap in time."""

    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), index=True)
    worker: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
