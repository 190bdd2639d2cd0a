"""What is happening now, for the operator's views (``genjob top``, progress bars): read-only queries.

Per job, the results of the last minutes in time buckets (tokens, accepted and proposed drafts), so
a view started now already shows the recent past; per worker, what it wrote lately and what it
holds. Also the one write of provenance: the model revisions and library versions a job ran with.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Integer, case, cast, func, select, update
from sqlalchemy.orm import Session

from genjob.constants import OPEN_ITEM_STATUSES, TERMINAL_JOB_STATUSES, ItemStatus
from genjob.db import changed_rows
from genjob.store.leases import as_utc
from genjob.tables import Item, Job, Result, utcnow


@dataclass(frozen=True)
class Bucket:
    start: int  # epoch seconds, a multiple of the bucket width
    items: int
    new_tokens: int
    accepted: int
    proposed: int


@dataclass(frozen=True)
class WorkerActivity:
    worker: str
    items: int  # results written since the window's start
    new_tokens: int
    last_result: datetime | None
    running: int  # items it holds running now
    stalled: int = 0  # of those, the ones whose lease ran out unrenewed: it makes no progress on them


def _epoch_bucket(session: Session, column: Any, width: int) -> ColumnElement[int]:
    if session.get_bind().dialect.name == "postgresql":
        seconds: ColumnElement[Any] = func.extract("epoch", column)
    else:
        seconds = cast(func.strftime("%s", column), Integer)
    return cast(func.floor(seconds / width), Integer) * width


def live_jobs(session: Session, *, limit: int = 20) -> Sequence[Job]:
    """Jobs that have not ended, running first, then queued, newest first."""
    query = (
        select(Job)
        .where(Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .order_by(Job.status.desc(), Job.created_at.desc())
        .limit(limit)
    )
    return session.scalars(query).all()


def result_buckets(
    session: Session, *, job_ids: Sequence[str], since: datetime, width: int
) -> dict[str, list[Bucket]]:
    """Per job, its results since ``since`` summed in buckets of ``width`` seconds (oldest first)."""
    if not job_ids:
        return {}
    bucket = _epoch_bucket(session, Result.created_at, width).label("bucket")
    query = (
        select(
            Result.job_id,
            bucket,
            func.count(),
            func.sum(Result.new_tokens),
            func.sum(Result.draft_accepted),
            func.sum(Result.draft_proposed),
        )
        .where(Result.job_id.in_(list(job_ids)), Result.created_at >= since)
        .group_by(Result.job_id, bucket)
        .order_by(bucket)
    )
    buckets: dict[str, list[Bucket]] = {job_id: [] for job_id in job_ids}
    for job_id, start, items, tokens, accepted, proposed in session.execute(query):
        buckets[job_id].append(Bucket(int(start), items, tokens or 0, accepted or 0, proposed or 0))
    return buckets


def running_items(session: Session, *, job_ids: Sequence[str]) -> dict[str, int]:
    """Items running now, per job."""
    if not job_ids:
        return {}
    query = (
        select(Item.job_id, func.count())
        .where(Item.job_id.in_(list(job_ids)), Item.status == ItemStatus.RUNNING)
        .group_by(Item.job_id)
    )
    return {job_id: count for job_id, count in session.execute(query)}


def worker_activity(
    session: Session, *, since: datetime, now: datetime | None = None
) -> list[WorkerActivity]:
    """Every worker that wrote a result since ``since`` or holds a running item now (``now``: when
    leases count as run out, for ``stalled``)."""
    now = now or utcnow()
    written = session.execute(
        select(Result.worker, func.count(), func.sum(Result.new_tokens), func.max(Result.created_at))
        .where(Result.created_at >= since, Result.worker.is_not(None))
        .group_by(Result.worker)
    ).all()
    holding = session.execute(
        select(Item.claimed_by, func.count(), func.sum(case((Item.lease_expires_at <= now, 1), else_=0)))
        .where(Item.status == ItemStatus.RUNNING, Item.claimed_by.is_not(None))
        .group_by(Item.claimed_by)
    ).all()
    running: dict[str, int] = {}
    stalled: dict[str, int] = {}
    for holder, count, lapsed in holding:
        worker = str(holder).rsplit("/", 1)[0]  # "name/pid": the worker is its name
        running[worker] = running.get(worker, 0) + count
        stalled[worker] = stalled.get(worker, 0) + int(lapsed or 0)
    seen: dict[str, WorkerActivity] = {}
    for name, items, tokens, last in written:
        worker = str(name)
        last = as_utc(last) if last is not None else None  # SQLite's max() of a timestamp: naive
        seen[worker] = WorkerActivity(
            worker, items, tokens or 0, last, running.pop(worker, 0), stalled.get(worker, 0)
        )
    for worker, count in running.items():
        seen[worker] = WorkerActivity(worker, 0, 0, None, count, stalled.get(worker, 0))
    return sorted(seen.values(), key=lambda activity: activity.worker)


def record_provenance(
    session: Session,
    *,
    job_id: str,
    model_revision: str | None,
    assistant_revision: str | None,
    versions: dict[str, str],
) -> bool:
    """Note what the job runs with, once: the first worker to get here writes it."""
    statement = (
        update(Job)
        .where(Job.id == job_id, Job.versions.is_(None))
        .values(model_revision=model_revision, assistant_revision=assistant_revision, versions=versions)
    )
    return bool(changed_rows(session, statement))


def state_counts(session: Session) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Jobs by status, and the open (pending, running) items of live jobs by (queue, state)."""
    jobs = {
        status: count
        for status, count in session.execute(select(Job.status, func.count()).group_by(Job.status))
    }
    query = (
        select(Job.queue, Item.status, func.count())
        .join(Item, Item.job_id == Job.id)
        .where(Job.status.not_in(list(TERMINAL_JOB_STATUSES)), Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .group_by(Job.queue, Item.status)
    )
    items = {(queue, status): count for queue, status, count in session.execute(query)}
    return jobs, items
