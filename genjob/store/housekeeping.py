"""Finding jobs by name or id prefix, deleting them, and purging old ones: in batches, each its own
transaction.

A big job has millions of items, results and attempts: deleting it in one transaction would hold
locks and bloat the log for minutes. So its rows go in batches (``DELETE_BATCH`` items at a time,
their results and attempts first), the job's row last, each batch committed on its own. Stopped
half-way (Ctrl-C, a lost connection), the job is still there with fewer rows, and running the same
command again finishes it. Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.db import changed_rows, session_scope
from genjob.tables import Attempt, Item, Job, Result

DELETE_BATCH = 5000


@dataclass(frozen=True)
class NameMatch:
    job: Job
    count: int  # jobs with this name; the newest is ``job``


def newest_named(session: Session, *, name: str) -> NameMatch | None:
    """The newest job called ``name``, and how many are."""
    count = session.scalar(select(func.count()).select_from(Job).where(Job.name == name)) or 0
    if not count:
        return None
    job = session.scalars(
        select(Job).where(Job.name == name).order_by(Job.created_at.desc(), Job.id.desc()).limit(1)
    ).one()
    return NameMatch(job, count)


def ids_starting_with(session: Session, *, prefix: str, limit: int) -> tuple[list[str], int]:
    """Up to ``limit`` ids of the jobs whose id starts with ``prefix`` (newest first), and how many are."""
    where = Job.id.startswith(prefix, autoescape=True)
    count = session.scalar(select(func.count()).select_from(Job).where(where)) or 0
    ids = session.scalars(select(Job.id).where(where).order_by(Job.created_at.desc(), Job.id).limit(limit))
    return list(ids), count


def _delete_item_batch(session: Session, *, job_id: str, batch: int) -> int:
    ids = session.scalars(select(Item.id).where(Item.job_id == job_id).limit(batch)).all()
    if not ids:
        return 0
    session.execute(delete(Result).where(Result.item_id.in_(ids)))
    session.execute(delete(Attempt).where(Attempt.item_id.in_(ids)))
    return changed_rows(session, delete(Item).where(Item.id.in_(ids)))


def delete_job_rows(url: str, *, job_id: str, batch: int = DELETE_BATCH) -> int:
    """Delete a job and everything of it, a batch per transaction; returns the items deleted."""
    deleted = 0
    while True:
        with session_scope(url) as session:
            moved = _delete_item_batch(session, job_id=job_id, batch=batch)
        deleted += moved
        if moved < batch:
            break
    with session_scope(url) as session:
        session.execute(delete(Attempt).where(Attempt.job_id == job_id))
        session.execute(delete(Result).where(Result.job_id == job_id))
        session.execute(delete(Job).where(Job.id == job_id))
    return deleted


def ended_before(session: Session, *, cutoff: datetime, limit: int) -> Sequence[tuple[str, int]]:
    """(id, items) of up to ``limit`` ended jobs that finished (or, never started, were created)
    before ``cutoff``, oldest first."""
    ended_at = func.coalesce(Job.finished_at, Job.created_at)
    query = (
        select(Job.id, Job.total)
        .where(Job.status.in_(list(TERMINAL_JOB_STATUSES)), ended_at < cutoff)
        .order_by(ended_at, Job.id)
        .limit(limit)
    )
    return [(job_id, total) for job_id, total in session.execute(query)]


@dataclass
class PurgeReport:
    jobs: int = 0
    items: int = 0


def purge_ended_jobs(
    url: str,
    *,
    cutoff: datetime,
    batch: int = DELETE_BATCH,
    on_job: Callable[[str, int], None] | None = None,
) -> PurgeReport:
    """Delete every ended job older than ``cutoff``, one job (in batches) at a time; safe to stop."""
    report = PurgeReport()
    while True:
        with session_scope(url) as session:
            due = ended_before(session, cutoff=cutoff, limit=100)
        if not due:
            return report
        for job_id, _total in due:
            items = delete_job_rows(url, job_id=job_id, batch=batch)
            report.jobs += 1
            report.items += items
            if on_job is not None:
                on_job(job_id, items)
