"""Leases: which worker process holds an item, until when, and taking items back from dead ones.

A worker reserves its chunk's pending items (``claimed_by`` + ``lease_expires_at``: a range of a
job's items, or a list of ids from an old-format message, in one UPDATE), claims them a group at a
time (``genjob.store.claim_items``: status running, ``attempts`` + 1, ``fence`` + 1) and renews the leases
of the group while it works (``renew_leases``, every lease/3). Another worker may take an item only
once its lease has run out; the sweeper (``reclaim_expired_leases``) queues such items again, and
fails those that used every try. Lease times are the workers' clocks (UTC), so clocks must agree to
well within a lease (NTP does).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, String, case, cast, func, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from genjob.constants import OPEN_ITEM_STATUSES, TERMINAL_JOB_STATUSES, AttemptOutcome, ItemStatus, JobStatus
from genjob.db import changed_rows
from genjob.tables import Attempt, Item, Job, utcnow

WORKER_LOST = "its worker was lost"

# What an open item of a job that ended becomes once the worker holding it is gone.
ITEM_STATUS_FOR_ENDED_JOB: dict[str, ItemStatus] = {
    JobStatus.CANCELLED: ItemStatus.CANCELLED,
    JobStatus.EXPIRED: ItemStatus.EXPIRED,
}


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def unindexed_eq(column: Any, value: Any) -> ColumnElement[bool]:
    """SQL ``column = value`` that no index can serve (``IS NOT DISTINCT FROM``: the same for a column
    that is never NULL), so the planner reaches the rows by the statement's other conditions.

    A hot-path statement that names a few items (by id, or a range of ``seq``) also checks their job
    and status; written plainly, the planner may serve those from ``ix_items_job_id_status`` whenever
    its statistics do not know the job yet (a fresh job: every job, until the next ANALYZE), and then
    reads every pending item of the job for each group it claims: O(items) per claim, O(items²) a job.
    """
    condition: ColumnElement[bool] = column.is_not_distinct_from(value)
    return condition


def ids_in_range(job_id: Any, start: Any, stop: Any, size: Any) -> Select[int]:
    """The ids of a job's items with ``seq`` in [start, stop), read in (job_id, seq) order, which only
    that unique index gives (values, or SQL expressions such as bind parameters)."""
    return (
        select(Item.id)
        .where(Item.job_id == job_id, Item.seq >= start, Item.seq < stop)
        .order_by(Item.seq)
        .limit(size)
    )


def lease_is_free(now: datetime | Any, *, worker: str | Any | None = None) -> ColumnElement[bool]:
    """SQL condition: the item is held by nobody, by ``worker``, or by a lease that ran out (``now``
    and ``worker``: values, or SQL expressions such as bind parameters)."""
    conditions = [Item.claimed_by.is_(None), Item.lease_expires_at <= now]
    if worker is not None:
        conditions.append(Item.claimed_by == worker)
    return or_(*conditions)


def gave_up_error(attempts: Any, last_error: Any) -> Any:
    """SQL: the error of an item that used every try (``attempts`` and ``last_error`` are columns)."""
    return (
        literal("gave up after ")
        + cast(attempts, String)
        + literal(" attempts; last: ")
        + func.coalesce(last_error, literal(WORKER_LOST))
    )


def reserve_items(
    session: Session,
    *,
    job_id: str,
    worker: str,
    lease_s: float,
    seq_range: tuple[int, int] | None = None,
    item_ids: Sequence[int] | None = None,
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> list[int]:
    """Lease a chunk's pending items to ``worker`` unless another live worker holds them: the items
    of ``job_id`` with ``seq`` in ``seq_range`` [start, stop), or those in ``item_ids``. Those that
    already used ``max_attempts`` tries fail instead (``gave up after N attempts; last: …``).

    Returns the ids it now holds, in input order: the others are final, or in another worker's hands
    (the sweeper queues them again if that worker dies), so a duplicate delivery costs one statement.
    """
    now = now or utcnow()
    # The items by primary key: the range's ids read in (job_id, seq) order (which only that index
    # gives), never by (job_id, status), which would read every item of the job (``unindexed_eq``).
    scope: list[ColumnElement[bool]]
    if seq_range is not None:
        start, stop = seq_range
        scope = [Item.id.in_(ids_in_range(job_id, start, stop, max(0, stop - start)).scalar_subquery())]
    else:
        scope = [unindexed_eq(Item.job_id, job_id), Item.id.in_(list(item_ids or []))]
    reserved = session.execute(
        update(Item)
        .where(*scope, unindexed_eq(Item.status, ItemStatus.PENDING), lease_is_free(now, worker=worker))
        .values(claimed_by=worker, lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(Item.id, Item.seq, Item.attempts)
    ).all()
    exhausted = [row.id for row in reserved if max_attempts is not None and row.attempts >= max_attempts]
    if exhausted:  # each try killed its worker, say: they fail now, counted in the job's ``failed``
        session.execute(
            update(Item)
            .where(Item.id.in_(exhausted))
            .values(
                status=ItemStatus.FAILED,
                error=gave_up_error(Item.attempts, Item.error),
                finished_at=now,
                lease_expires_at=None,
            )
        )
        session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + len(exhausted)))
    kept = sorted((row for row in reserved if row.id not in exhausted), key=lambda row: row.seq)
    return [row.id for row in kept]


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


def end_leases(session: Session, *, item_ids: Sequence[int], worker: str, now: datetime | None = None) -> int:
    """End now the leases ``worker`` holds on these open items (it stops): a sweeper queues them again."""
    now = now or utcnow()
    return changed_rows(
        session,
        update(Item)
        .where(
            Item.id.in_(list(item_ids)), Item.claimed_by == worker, Item.status.in_(list(OPEN_ITEM_STATUSES))
        )
        .values(lease_expires_at=now),
    )


def record_lost_tries(session: Session, *, item_ids: Sequence[int], now: datetime) -> None:
    """The tries of running items whose worker died: an attempt row each, from the item's own claim
    (``started_at``, ``claimed_by``) to ``now``, outcome ``lost``."""
    if not item_ids:
        return
    lost = select(
        Item.job_id,
        Item.id,
        Item.claimed_by,
        func.coalesce(Item.started_at, now),
        literal(now, type_=Item.finished_at.type),
        literal(AttemptOutcome.LOST.value),
        literal("its worker was lost (lease ran out)"),
    ).where(Item.id.in_(list(item_ids)), Item.status == ItemStatus.RUNNING)
    columns = ["job_id", "item_id", "worker", "started_at", "finished_at", "outcome", "error"]
    session.execute(insert(Attempt).from_select(columns, lost))


def expired_lease_seqs(
    session: Session, *, job_id: str, now: datetime, max_attempts: int | None = None
) -> list[int]:
    """The seqs of the job's open items whose lease ran out and that ``reclaim_expired_leases`` would
    queue again (tries left), in order; nothing is changed (``genjob requeue --dry-run``)."""
    query = select(Item.seq).where(
        Item.job_id == job_id, Item.status.in_(list(OPEN_ITEM_STATUSES)), Item.lease_expires_at <= now
    )
    if max_attempts is not None:
        query = query.where(Item.attempts < max_attempts)
    return list(session.scalars(query.order_by(Item.seq)))


def reclaim_expired_leases(
    session: Session,
    *,
    now: datetime | None = None,
    job_id: str | None = None,
    max_attempts: int | None = None,
    limit: int = 10_000,
    gave_up_counts: dict[str, int] | None = None,
    handed_back: dict[str, int] | None = None,
) -> dict[str, tuple[str, list[int]]]:
    """Take back open items whose lease ran out (their worker died): {job id: (queue, their seqs)};
    ``gave_up_counts``, where given, gets how many items of each job failed for good here (out of tries);
    ``handed_back``, how many of those queued again their worker had handed back (pending: a graceful
    stop or a fault ended the lease on purpose) rather than lost (still running: it died or stalled).

    Items of live jobs go back to pending, unleased, for the caller to queue again before it
    commits (if the commit is lost, the leases are still expired and a claim takes them anyway);
    those that used ``max_attempts`` tries fail instead (``gave up after N attempts; last: …``), so
    a worker that dies on them every time cannot loop a job forever. Items of jobs that ended
    meanwhile get the job's fate (cancelled, expired). Rows another sweeper is handling are skipped
    (SKIP LOCKED), so two sweepers never queue one item twice. Set-based: a few statements in all.
    """
    now = now or utcnow()
    query = (
        select(Item.id, Item.job_id, Item.seq, Item.attempts, Job.status, Job.queue, Item.status)
        .join(Job, Job.id == Item.job_id)
        .where(Item.status.in_(list(OPEN_ITEM_STATUSES)), Item.lease_expires_at <= now)
        .order_by(Item.job_id, Item.seq)
        .limit(limit)
        .with_for_update(of=Item, skip_locked=True)
    )
    if job_id is not None:
        query = query.where(Item.job_id == job_id)
    rows = session.execute(query).all()
    if not rows:
        return {}
    record_lost_tries(session, item_ids=[row.id for row in rows], now=now)
    requeue: dict[str, tuple[str, list[int]]] = {}
    by_fate: dict[ItemStatus, list[int]] = {}
    gave_up: dict[str, list[int]] = {}
    back: list[int] = []
    for item_id, item_job_id, seq, attempts, job_status, queue, item_status in rows:
        if job_status in TERMINAL_JOB_STATUSES:
            fate = ITEM_STATUS_FOR_ENDED_JOB.get(job_status, ItemStatus.FAILED)
            by_fate.setdefault(fate, []).append(item_id)
        elif max_attempts is not None and attempts >= max_attempts:
            gave_up.setdefault(item_job_id, []).append(item_id)
        else:
            requeue.setdefault(item_job_id, (queue, []))[1].append(seq)
            back.append(item_id)
            if handed_back is not None and item_status == ItemStatus.PENDING:
                handed_back[item_job_id] = handed_back.get(item_job_id, 0) + 1
    for fate, ids in by_fate.items():
        session.execute(
            update(Item)
            .where(Item.id.in_(ids))
            .values(status=fate, finished_at=now, claimed_by=None, lease_expires_at=None)
        )
    for failed_job, ids in gave_up.items():
        session.execute(
            update(Item)
            .where(Item.id.in_(ids))
            .values(
                status=ItemStatus.FAILED,
                error=gave_up_error(
                    Item.attempts, case((Item.status == ItemStatus.RUNNING, None), else_=Item.error)
                ),
                finished_at=now,
                claimed_by=None,
                lease_expires_at=None,
            )
        )
        session.execute(update(Job).where(Job.id == failed_job).values(failed=Job.failed + len(ids)))
        if gave_up_counts is not None:
            gave_up_counts[failed_job] = gave_up_counts.get(failed_job, 0) + len(ids)
    if back:
        session.execute(
            update(Item)
            .where(Item.id.in_(back))
            .values(status=ItemStatus.PENDING, claimed_by=None, lease_expires_at=None)
        )
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
