"""Whole jobs in the database: create (streamed, COPY on Postgres), read, list, cancel, fail, finalize,
expire, retry, and the pending items to queue. Keyword-only functions taking a Session.

Item transitions live in ``genjob.store.items``, leases in ``genjob.store.leases``, what a job has
queued in ``genjob.store.queued``.
Must not know: Celery, torch, transformers, the HTTP API or the CLI.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from genjob.constants import (
    OPEN_ITEM_STATUSES,
    TERMINAL_JOB_STATUSES,
    ItemStatus,
    JobStatus,
)
from genjob.db import changed_rows
from genjob.echo import echoed
from genjob.store.item_rows import insert_items
from genjob.store.leases import as_utc
from genjob.tables import LOCAL_OWNER, Item, Job, Result, utcnow

if TYPE_CHECKING:  # formats.export reads the store: the items are only typed here
    from genjob.formats.lines import PromptItem
    from genjob.options import JobSpec  # pydantic's models, built at import: not for reading a job


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {echoed(job_id)}")
        self.job_id = job_id


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


def create_job(
    session: Session,
    *,
    spec: JobSpec,
    items: Iterable[PromptItem],
    queue: str,
    name: str | None = None,
    expires_at: datetime | None = None,
    job_id: str | None = None,
    owner: str = LOCAL_OWNER,
    model_name: str | None = None,
    assistant_name: str | None = None,
) -> Job:
    """Insert a job and all its items in the caller's transaction, streamed in flat memory.

    Postgres (psycopg) gets one ``COPY items FROM STDIN`` (``item_rows``). ``owner`` is the API
    key's owner id (``local``: the CLI); the names are what the submitter called the models (shown
    instead of the paths the workers load).
    """
    job = Job(
        owner=owner,
        model_name=model_name,
        assistant_name=assistant_name,
        id=job_id or new_job_id(),
        name=name,
        status=JobStatus.QUEUED,
        model=spec.model,
        assistant=spec.assistant,
        mode=spec.mode,
        queue=queue,
        spec=spec.model_dump(mode="json"),
        total=0,
        done=0,
        failed=0,
        expires_at=expires_at,
    )
    session.add(job)
    session.flush()
    job.total = insert_items(session, job_id=job.id, items=items)
    job.queued_seq = 0
    job.queue_progress_at = utcnow()  # its publisher starts now; a sweeper takes over if it stops
    session.flush()
    return job


def get_job(session: Session, *, job_id: str, owner: str | None = None) -> Job:
    """The job with this id, or the only job whose id starts with it; with ``owner``, only among
    that owner's jobs (another owner's job is not found, whole id or prefix)."""
    job = session.get(Job, job_id)
    if job is not None and owner in (None, job.owner):
        return job
    query = select(Job).where(Job.id.startswith(job_id, autoescape=True))
    if owner is not None:
        query = query.where(Job.owner == owner)
    matches = session.scalars(query.limit(2)).all()
    if len(matches) == 1:
        return matches[0]
    raise JobNotFound(job_id)


def list_jobs(
    session: Session,
    *,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
    owner: str | None = None,
) -> Sequence[Job]:
    """Newest first; with ``owner``, only that owner's jobs."""
    query = select(Job).order_by(Job.created_at.desc(), Job.id)
    if status:
        query = query.where(Job.status == status)
    if owner is not None:
        query = query.where(Job.owner == owner)
    return session.scalars(query.limit(limit).offset(offset)).all()


def finalize_settled_jobs(session: Session) -> list[str]:
    """End every live job whose items are all final (its last worker died before it could say so,
    or the sweeper failed its last items); returns their ids."""
    open_item = select(Item.id).where(Item.job_id == Job.id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
    query = select(Job.id).where(
        Job.status.not_in(list(TERMINAL_JOB_STATUSES)), Job.total > 0, ~open_item.exists()
    )
    return [job_id for job_id in session.scalars(query).all() if finalize_job(session, job_id=job_id)]


def cancel_job(session: Session, *, job: Job) -> bool:
    """Cancel a job that has not ended: pending items are cancelled; the rows in flight are stopped by
    their worker at its next check (they end cancelled); what finished is kept."""
    moved = changed_rows(
        session,
        update(Job)
        .where(Job.id == job.id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .values(status=JobStatus.CANCELLED, finished_at=utcnow()),
    )
    if not moved:
        return False
    session.execute(
        update(Item)
        .where(Item.job_id == job.id, Item.status == ItemStatus.PENDING)
        .values(status=ItemStatus.CANCELLED, finished_at=utcnow())
    )
    session.refresh(job)
    return True


def mark_job_running(session: Session, *, job_id: str) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.RUNNING, started_at=utcnow())
    )


def fail_job(session: Session, *, job_id: str, error: str) -> None:
    """A job-level failure (say, its model cannot be loaded): every open item fails with it."""
    failed = changed_rows(
        session,
        update(Item)
        .where(Item.job_id == job_id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .values(status=ItemStatus.FAILED, error=error, finished_at=utcnow()),
    )
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .values(status=JobStatus.FAILED, error=error, failed=Job.failed + failed, finished_at=utcnow())
    )


def finalize_job(session: Session, *, job_id: str) -> str | None:
    """End a running job whose items are all final; return its new status, or None if still open."""
    # EXISTS, not count(*): a chunk's close must not read every open item of a large job.
    open_items = session.scalar(
        select(exists().where(Item.job_id == job_id, Item.status.in_(list(OPEN_ITEM_STATUSES))))
    )
    if open_items:
        return None
    job = session.get(Job, job_id)
    if job is None or job.status in TERMINAL_JOB_STATUSES:
        return None
    status = JobStatus.FAILED if job.done == 0 and job.failed > 0 else JobStatus.COMPLETED
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .values(status=status, finished_at=utcnow())
    )
    return status


def expire_due_jobs(session: Session, *, now: datetime | None = None, job_id: str | None = None) -> list[str]:
    """End every job (or just ``job_id``) past its ``expires_at``: status expired, pending items
    expired. An item in flight finishes and is kept. Returns the ids of the jobs it ended."""
    now = now or utcnow()
    query = select(Job.id, Job.expires_at).where(
        Job.status.not_in(list(TERMINAL_JOB_STATUSES)), Job.expires_at.is_not(None), Job.expires_at <= now
    )
    if job_id is not None:
        query = query.where(Job.id == job_id)
    ended = []
    for due_id, expires_at in session.execute(query).all():
        assert expires_at is not None  # the query's condition
        error = f"expired: not finished by {as_utc(expires_at):%Y-%m-%d %H:%M:%S} UTC"
        moved = changed_rows(
            session,
            update(Job)
            .where(Job.id == due_id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
            .values(status=JobStatus.EXPIRED, error=error, finished_at=now),
        )
        if moved:
            session.execute(
                update(Item)
                .where(Item.job_id == due_id, Item.status == ItemStatus.PENDING)
                .values(status=ItemStatus.EXPIRED, finished_at=now, lease_expires_at=None)
            )
            ended.append(due_id)
    return ended


RETRYABLE_JOB_STATUSES = frozenset(
    {JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.COMPLETED, JobStatus.FAILED}
)


def retry_failed_items(session: Session, *, job: Job, expires_at: datetime | None = None) -> int:
    """Put a job's failed items back to pending with fresh tries; the job runs again. Returns how many.

    Only failed items move: done items keep their results. A job that ended completed or failed
    is queued again (its deadline is ``expires_at``, none by default). ``attempts`` (the budget)
    starts again from 0; ``fence`` does not, so a stale worker's late result is still refused.
    Safe to repeat: a second call finds no failed items.
    """
    if job.status not in RETRYABLE_JOB_STATUSES:
        raise ValueError(
            f"job {job.id} ended {job.status}: only failed items of a live, completed or "
            "failed job are retried"
        )
    retried = changed_rows(
        session,
        update(Item)
        .where(Item.job_id == job.id, Item.status == ItemStatus.FAILED)
        .values(
            status=ItemStatus.PENDING,
            attempts=0,
            error=None,
            finished_at=None,
            claimed_by=None,
            lease_expires_at=None,
        ),
    )
    if retried:
        values: dict[str, Any] = {"failed": Job.failed - retried}
        if job.status in TERMINAL_JOB_STATUSES:
            values.update(status=JobStatus.QUEUED, error=None, finished_at=None, expires_at=expires_at)
        session.execute(update(Job).where(Job.id == job.id).values(**values))
        session.refresh(job)
    return retried


def iter_results(
    session: Session, *, job_id: str, status: str | None = None
) -> Iterator[tuple[Item, Result | None]]:
    """Every item of the job (or those in ``status``) in input order, with its result if any (streamed)."""
    query = (
        select(Item, Result)
        .outerjoin(Result, Result.item_id == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.seq)
        .execution_options(yield_per=1000)
    )
    if status is not None:
        query = query.where(Item.status == status)
    for row in session.execute(query):
        yield row.tuple()


@dataclass(frozen=True)
class ChunkMeasurements:
    """What a worker's engine measured while running one chunk (sums), added to the job's."""

    busy_seconds: float
    decode_rounds: int
    decode_rows: int
    decode_tokens: int
    decode_seconds: float
    probe_rounds: int
    probe_tokens: int
    probe_seconds: float
    probe_sq: float
    prefill_seconds: float
    gamma_hist: dict[int, int]
    last_draft_tokens: int | None  # the draft length the engine ended the chunk with
    drafts_hist: dict[int, int] = field(default_factory=dict)  # row-rounds by the drafts the row had
    proposer_counts: dict[str, int] = field(default_factory=dict)  # mode auto: ``name:field`` -> count
    rounds_by_rows: dict[str, float] = field(default_factory=dict)  # ``B:field`` (``EngineStats.by_rows``)


HISTOGRAMS = ("gamma_hist", "drafts_hist", "proposer_counts", "rounds_by_rows")  # merged key by key
SUMS = tuple(  # the job's columns a chunk's measurements add to
    f.name for f in fields(ChunkMeasurements) if f.name not in (*HISTOGRAMS, "last_draft_tokens")
)


def merged(
    hist: dict[str, Any] | None, more: dict[int, int] | dict[str, int] | dict[str, float]
) -> dict[str, Any]:
    """A stored histogram (JSON: string keys) plus a chunk's, key by key."""
    total: dict[str, Any] = dict(hist or {})
    for key, n in more.items():
        total[str(key)] = total.get(str(key), 0) + n
    return total


def record_chunk(session: Session, *, job_id: str, measured: ChunkMeasurements) -> Job | None:
    """Add a chunk's measurements to the job (its row locked, so concurrent chunks add up). Returns the
    job (for the caller to derive the expected speedup and costs from the new sums)."""
    job = session.get(Job, job_id, with_for_update=True, populate_existing=True)
    if job is None:
        return None
    for name in SUMS:
        setattr(job, name, getattr(job, name) + getattr(measured, name))
    for name in HISTOGRAMS:
        setattr(job, name, merged(getattr(job, name), getattr(measured, name)))
    if measured.last_draft_tokens is not None:
        job.last_draft_tokens = measured.last_draft_tokens
    session.flush()
    return job
