"""Leases: which worker process holds an item, until when, and taking items back from dead ones.

A worker reserves its chunk's pending items (``claimed_by`` + ``lease_expires_at``), claims each
in turn (``store.claim_item``: status running, ``attempts`` + 1) and renews the leases while it
works (``renew_leases``, every lease/3). Another worker may take an item only once its lease has
run out; the sweeper (``reclaim_expired_leases``) queues such items again. Lease times are the
workers' clocks (UTC), so clocks must agree to well within a lease (NTP does).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from genjob.constants import OPEN_ITEM_STATUSES, TERMINAL_JOB_STATUSES, AttemptOutcome, ItemStatus, JobStatus
from genjob.db import changed_rows
from genjob.tables import Attempt, Item, Job, utcnow

# What an open item of a job that ended becomes once the worker holding it is gone.
ITEM_STATUS_FOR_ENDED_JOB: dict[str, ItemStatus] = {
    JobStatus.CANCELLED: ItemStatus.CANCELLED,
    JobStatus.EXPIRED: ItemStatus.EXPIRED,
}


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def lease_is_free(now: datetime, *, worker: str | None = None) -> ColumnElement[bool]:
    """SQL condition: the item is held by nobody, by ``worker``, or by a lease that ran out."""
    conditions = [Item.claimed_by.is_(None), Item.lease_expires_at <= now]
    if worker is not None:
        conditions.append(Item.claimed_by == worker)
    return or_(*conditions)


def reserve_items(
    session: Session, *, item_ids: Sequence[int], worker: str, lease_s: float, now: datetime | None = None
) -> set[int]:
    """Lease a chunk's pending items to ``worker`` unless another live worker holds them.

    Returns the ids it now holds: the others are final, or in another worker's hands (the
    sweeper queues them again if that worker dies), so a duplicate delivery costs one statement.
    """
    now = now or utcnow()
    reserved = session.execute(
        update(Item)
        .where(Item.id.in_(item_ids), Item.status == ItemStatus.PENDING, lease_is_free(now, worker=worker))
        .values(claimed_by=worker, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Item.id)
    )
    return set(reserved.scalars())


def renew_leases(
    session: Session, *, item_ids: Sequence[int], worker: str, lease_s: float, now: datetime | None = None
) -> int:
    """Extend the leases ``worker`` still holds on these items (the heartbeat)."""
    now = now or utcnow()
    return changed_rows(
        session,
        update(Item)
        .where(
            Item.id.in_(item_ids),
            Item.claimed_by == worker,
            Item.status.in_(list(OPEN_ITEM_STATUSES)),
        )
        .values(lease_expires_at=now + timedelta(seconds=lease_s)),
    )


def release_reservations(session: Session, *, item_ids: Sequence[int], worker: str) -> int:
    """Give back the pending items of a chunk that stopped early (cancelled, expired)."""
    return changed_rows(
        session,
        update(Item)
        .where(Item.id.in_(item_ids), Item.claimed_by == worker, Item.status == ItemStatus.PENDING)
        .values(claimed_by=None, lease_expires_at=None),
    )


def close_open_attempts(session: Session, *, item_id: int, now: datetime) -> None:
    """Attempts left open by a worker that died: they ended, at the latest, now."""
    session.execute(
        update(Attempt)
        .where(Attempt.item_id == item_id, Attempt.finished_at.is_(None))
        .values(finished_at=now, outcome=AttemptOutcome.LOST, error="its worker was lost (lease ran out)")
    )


def reclaim_expired_leases(
    session: Session, *, now: datetime | None = None, job_id: str | None = None, limit: int = 10_000
) -> dict[str, tuple[str, list[int]]]:
    """Take back open items whose lease ran out (their worker died): {job id: (queue, item ids)}.

    Items of live jobs go back to pending, unleased, for the caller to queue again before it
    commits (if the commit is lost, the leases are still expired and a claim takes them anyway).
    Items of jobs that ended meanwhile get the job's fate (cancelled, expired). Rows another
    sweeper is handling are skipped (SKIP LOCKED), so two sweepers never queue one item twice.
    """
    now = now or utcnow()
    query = (
        select(Item.id, Item.job_id, Job.status, Job.queue)
        .join(Job, Job.id == Item.job_id)
        .where(Item.status.in_(list(OPEN_ITEM_STATUSES)), Item.lease_expires_at <= now)
        .order_by(Item.job_id, Item.seq)
        .limit(limit)
        .with_for_update(of=Item, skip_locked=True)
    )
    if job_id is not None:
        query = query.where(Item.job_id == job_id)
    requeue: dict[str, tuple[str, list[int]]] = {}
    for item_id, item_job_id, job_status, queue in session.execute(query).all():
        close_open_attempts(session, item_id=item_id, now=now)
        values: dict[str, Any] = {"status": ItemStatus.PENDING, "claimed_by": None, "lease_expires_at": None}
        if job_status in TERMINAL_JOB_STATUSES:
            status = ITEM_STATUS_FOR_ENDED_JOB.get(job_status, ItemStatus.FAILED)
            values.update(status=status, finished_at=now)
        else:
            requeue.setdefault(item_job_id, (queue, []))[1].append(item_id)
        session.execute(update(Item).where(Item.id == item_id).values(**values))
    return requeue


def give_up_leases(session: Session, *, worker: str, now: datetime | None = None) -> int:
    """End at once the leases ``worker`` holds on open items (it stops), so they can be taken back now."""
    now = now or utcnow()
    return changed_rows(
        session,
        update(Item)
        .where(Item.claimed_by == worker, Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .values(lease_expires_at=now),
    )
