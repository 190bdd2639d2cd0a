"""Item transitions, set-based: claim a group, finish a group (results, attempts, the job's sums), fail,
release. Core SQL, a few statements per group of items, never a statement per item on the hot path.

Fencing: every claim raises ``items.fence`` (never reset, not even by ``genjob retry``, which resets
``attempts``, the budget); an item moves to a final status at most once, by a conditional UPDATE that
names the fence its claim got, and only that transition writes its result (an upsert on (job_id,
item_id)) and bumps the job's counters, all in one transaction. A redelivered chunk therefore skips
finished items, and a stale worker's late result (its lease was taken over, or the item was retried
meanwhile) is refused (its attempt is recorded ``superseded``).

An attempt's row is written once, when it ends (done, failed, retried, superseded, released); a try
whose worker died is written by the sweeper as ``lost`` from the item's own ``started_at`` and
``claimed_by``. Must not know: Celery, torch, the HTTP API.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, insert, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES, AttemptOutcome, ItemStatus, JobStatus
from genjob.store.claims import CLAIMED_COLUMNS, ClaimedItem, Refused
from genjob.store.jobs import expire_due_jobs
from genjob.store.leases import as_utc, gave_up_error, lease_is_free, unindexed_eq
from genjob.store.postgres_groups import SUMMED, finish_on_postgres
from genjob.tables import Attempt, Item, Job, Result, utcnow


def give_up_exhausted(
    session: Session, *, job_id: str, item_ids: Sequence[int], max_attempts: int, now: datetime | None = None
) -> int:
    """Fail the pending items among ``item_ids`` that already used ``max_attempts`` (say, each try
    killed its worker); returns how many, counted in the job's ``failed``."""
    now = now or utcnow()
    failed = session.execute(
        update(Item)
        .where(Item.id.in_(list(item_ids)), Item.status == ItemStatus.PENDING, Item.attempts >= max_attempts)
        .values(
            status=ItemStatus.FAILED,
            error=gave_up_error(Item.attempts, Item.error),
            finished_at=now,
            lease_expires_at=None,
        )
        .returning(Item.id)
    ).all()
    if failed:
        session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + len(failed)))
    return len(failed)


def _job_is_live(session: Session, *, job_id: str, now: datetime) -> bool:
    """Share-lock the job's row (the order cancel and expiry lock it in, so a cancel waits for claims
    under way and every later claim sees it) and say whether it is still live (expiring it if due)."""
    row = session.execute(
        select(Job.status, Job.expires_at).where(Job.id == job_id).with_for_update(read=True)
    ).one_or_none()
    if row is None or row.status in TERMINAL_JOB_STATUSES:
        return False
    if row.expires_at is not None and as_utc(row.expires_at) <= now:
        return not expire_due_jobs(session, now=now, job_id=job_id)
    return True


def claim_items(
    session: Session,
    *,
    job_id: str,
    item_ids: Sequence[int],
    worker: str,
    lease_s: float,
    max_attempts: int,
    now: datetime | None = None,
) -> list[ClaimedItem] | Refused:
    """Start a try on each open, claimable item among ``item_ids`` (one UPDATE … RETURNING): status
    running, ``attempts`` + 1, ``fence`` + 1, leased to ``worker``. Items that are final, held by
    another live worker or out of tries are left out (the caller skips them). A job that ended (or
    is past its deadline) refuses the whole claim: the UPDATE share-locks the job's row first (the
    order cancel and expiry lock it in, so a cancel waits for claims under way and every later claim
    sees it: no item starts after a cancel commits)."""
    now = now or utcnow()
    if not item_ids:
        return [] if _job_is_live(session, job_id=job_id, now=now) else Refused.JOB_ENDED
    live_job = (
        select(Job.id)
        .where(
            Job.id == job_id,
            Job.status.not_in(list(TERMINAL_JOB_STATUSES)),
            or_(Job.expires_at.is_(None), Job.expires_at > now),
        )
        .with_for_update(read=True)
    )
    rows = session.execute(
        update(Item)
        .where(
            live_job.exists(),
            Item.id.in_(list(item_ids)),  # by primary key only (``unindexed_eq``)
            unindexed_eq(Item.job_id, job_id),
            unindexed_eq(Item.status, ItemStatus.PENDING),
            Item.attempts < max_attempts,
            lease_is_free(now, worker=worker),
        )
        .values(
            status=ItemStatus.RUNNING,
            attempts=Item.attempts + 1,
            fence=Item.fence + 1,
            started_at=now,
            claimed_by=worker,
            lease_expires_at=now + timedelta(seconds=lease_s),
        )
        .returning(*(getattr(Item, name) for name in CLAIMED_COLUMNS))
    ).all()
    if not rows and not _job_is_live(session, job_id=job_id, now=now):
        return Refused.JOB_ENDED
    order = {item_id: index for index, item_id in enumerate(item_ids)}
    claimed = [ClaimedItem(job_id=job_id, started_at=now, **row._mapping) for row in rows]
    return sorted(claimed, key=lambda item: order[item.id])


def _fenced(items: Sequence[ClaimedItem]) -> Any:
    """SQL condition: each item still running under the claim that gave it this fence."""
    return (
        tuple_(Item.id, Item.fence).in_([(item.id, item.fence) for item in items]),
        unindexed_eq(Item.status, ItemStatus.RUNNING),  # never every running item (by status)
    )


def _record_attempts(
    session: Session,
    *,
    items: Sequence[ClaimedItem],
    worker: str,
    outcome: dict[int, str],
    errors: dict[int, str | None] | None = None,
    now: datetime,
) -> None:
    if not items:
        return
    errors = errors or {}
    session.execute(
        insert(Attempt),
        [
            {
                "job_id": item.job_id,
                "item_id": item.id,
                "worker": worker,
                "started_at": item.started_at,
                "finished_at": now,
                "outcome": outcome[item.id],
                "error": errors.get(item.id),
            }
            for item in items
        ],
    )


def _upsert_results(session: Session, rows: list[dict[str, Any]]) -> None:
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    statement = module.insert(Result)
    changed = {key: statement.excluded[key] for key in rows[0] if key not in ("job_id", "item_id")}
    session.execute(statement.on_conflict_do_update(index_elements=["job_id", "item_id"], set_=changed), rows)


def finish_items(
    session: Session, *, finished: Sequence[tuple[ClaimedItem, dict[str, Any]]], worker: str
) -> set[int]:
    """Record finished items once: status done, results upserted, attempts written, the job's sums
    bumped, a few statements for the whole group. Returns the ids accepted; the others were final
    already or taken over (a newer fence): their attempts are recorded ``superseded``."""
    if not finished:
        return set()
    if session.get_bind().dialect.name == "postgresql":
        moved: set[int] = set()
        for job_id in {item.job_id for item, _ in finished}:
            group = [(item, row) for item, row in finished if item.job_id == job_id]
            moved |= finish_on_postgres(session, job_id=job_id, finished=group, holder=worker)
        return moved
    now = utcnow()
    items = [item for item, _ in finished]
    moved = set(
        session.scalars(
            update(Item)
            .where(*_fenced(items))
            .values(status=ItemStatus.DONE, error=None, finished_at=now, lease_expires_at=None)
            .returning(Item.id)
        )
    )
    outcome = {
        item.id: AttemptOutcome.DONE if item.id in moved else AttemptOutcome.SUPERSEDED for item in items
    }
    _record_attempts(session, items=items, worker=worker, outcome=dict(outcome), now=now)
    accepted = [(item, result) for item, result in finished if item.id in moved]
    if not accepted:
        return moved
    _upsert_results(session, [{"job_id": item.job_id, "item_id": item.id, **row} for item, row in accepted])
    for job_id in {item.job_id for item, _ in accepted}:
        rows = [row for item, row in accepted if item.job_id == job_id]
        sums: dict[str, Any] = {"done": Job.done + len(rows)}
        for name in SUMMED:
            sums[name] = getattr(Job, name) + sum(int(row[name]) for row in rows)
        sums["generate_seconds"] = Job.generate_seconds + sum(float(row["latency_s"]) for row in rows)
        checked = [row["lossless_match"] for row in rows if row.get("lossless_match") is not None]
        if checked:
            sums["lossless_checked"] = Job.lossless_checked + len(checked)
            sums["lossless_matches"] = Job.lossless_matches + sum(1 for match in checked if match)
        session.execute(update(Job).where(Job.id == job_id).values(**sums))
    return moved


def fail_items(session: Session, *, failed: Sequence[tuple[ClaimedItem, str]], worker: str) -> set[int]:
    """Mark items failed with their errors, once (fenced like ``finish_items``); returns the ids moved."""
    if not failed:
        return set()
    now = utcnow()
    errors = {item.id: error for item, error in failed}
    items = [item for item, _ in failed]
    moved = set(
        session.scalars(
            update(Item)
            .where(*_fenced(items))
            .values(
                status=ItemStatus.FAILED,
                error=case(errors, value=Item.id),
                finished_at=now,
                lease_expires_at=None,
            )
            .returning(Item.id)
        )
    )
    outcome = {
        item.id: AttemptOutcome.FAILED if item.id in moved else AttemptOutcome.SUPERSEDED for item in items
    }
    _record_attempts(session, items=items, worker=worker, outcome=dict(outcome), errors=dict(errors), now=now)
    for job_id in {item.job_id for item in items if item.id in moved}:
        count = sum(1 for item in items if item.job_id == job_id and item.id in moved)
        session.execute(update(Job).where(Job.id == job_id).values(failed=Job.failed + count))
    return moved


def release_items(
    session: Session,
    *,
    items: Sequence[ClaimedItem],
    worker: str,
    error: str | None,
    outcome: AttemptOutcome,
    refund: bool = False,
    expire_lease: bool = False,
) -> set[int]:
    """Running items go back to pending (fenced): ``retried`` keeps them leased to us (we run them
    again); ``released`` (a graceful stop: ``refund`` gives the try back) or ``lost`` (a worker
    fault: the try counts) with ``expire_lease`` ends the lease at once, for a sweeper to queue them
    again now."""
    if not items:
        return set()
    now = utcnow()
    values: dict[str, Any] = {"status": ItemStatus.PENDING}
    if error is not None:
        values["error"] = error
    if refund:
        values["attempts"] = Item.attempts - 1
    if expire_lease:
        values["lease_expires_at"] = now
    moved = set(session.scalars(update(Item).where(*_fenced(items)).values(**values).returning(Item.id)))
    outcomes = {item.id: outcome if item.id in moved else AttemptOutcome.SUPERSEDED for item in items}
    _record_attempts(
        session,
        items=items,
        worker=worker,
        outcome=dict(outcomes),
        errors={i.id: error for i in items},
        now=now,
    )
    return moved


# An item stopped because its job ended ends as its job did.
STOPPED_AS = {JobStatus.CANCELLED: ItemStatus.CANCELLED, JobStatus.EXPIRED: ItemStatus.EXPIRED}


def stop_items(session: Session, *, items: Sequence[ClaimedItem], worker: str) -> set[int]:
    """Running items of a job that was cancelled or expired meanwhile end now, unfinished (fenced):
    ``cancelled`` or ``expired`` as their job, their tries recorded ``stopped``. Returns those moved."""
    if not items:
        return set()
    now = utcnow()
    statuses = dict(
        session.execute(select(Job.id, Job.status).where(Job.id.in_({i.job_id for i in items}))).all()
    )
    moved: set[int] = set()
    for job_id, status in statuses.items():
        ended_as = STOPPED_AS.get(JobStatus(status))
        if ended_as is None:
            continue  # not cancelled nor expired: nothing to stop
        mine = [item for item in items if item.job_id == job_id]
        moved |= set(
            session.scalars(
                update(Item)
                .where(*_fenced(mine))
                .values(status=ended_as, finished_at=now, lease_expires_at=None)
                .returning(Item.id)
            )
        )
    outcome = {i.id: AttemptOutcome.STOPPED if i.id in moved else AttemptOutcome.SUPERSEDED for i in items}
    _record_attempts(session, items=items, worker=worker, outcome=dict(outcome), now=now)
    return moved


def count_a_try_and_let_go(
    session: Session, *, item_ids: Sequence[int], worker: str, error: str, max_attempts: int
) -> int:
    """A worker's fault while it holds items it has not claimed yet (its models cannot start, say):
    each costs a try, as a crash would, and its lease ends now so a sweeper queues it again (or,
    out of tries, it fails with ``error``). Returns how many were let go."""
    now = utcnow()
    held = (Item.id.in_(list(item_ids)), Item.claimed_by == worker, Item.status == ItemStatus.PENDING)
    moved = session.execute(
        update(Item)
        .where(*held)
        .values(attempts=Item.attempts + 1, error=error, lease_expires_at=now)
        .returning(Item.id, Item.job_id)
    ).all()
    if moved:  # each such try is recorded, as a try lost to the worker's fault
        session.execute(
            insert(Attempt),
            [
                {
                    "job_id": row.job_id,
                    "item_id": row.id,
                    "worker": worker,
                    "started_at": now,
                    "finished_at": now,
                    "outcome": AttemptOutcome.LOST,
                    "error": error,
                }
                for row in moved
            ],
        )
    for job_id in {row.job_id for row in moved}:
        give_up_exhausted(
            session,
            job_id=job_id,
            item_ids=[r.id for r in moved if r.job_id == job_id],
            max_attempts=max_attempts,
        )
    return len(moved)


def write_and_claim(
    session: Session,
    *,
    job_id: str,
    holder: str,
    lease_s: float,
    max_attempts: int,
    finished: list[tuple[ClaimedItem, dict[str, Any]]],
    failed: list[tuple[ClaimedItem, str]],
    claim: list[int],
) -> tuple[set[int], set[int], list[ClaimedItem] | Refused]:
    """The item loop's one transaction per group: write the rows that finished or failed, then
    claim the next group. Returns (ids done, ids failed, the claim)."""
    done = finish_items(session, finished=finished, worker=holder)
    gone = fail_items(session, failed=failed, worker=holder)
    claimed: list[ClaimedItem] | Refused = []
    if claim:
        claimed = claim_items(
            session, job_id=job_id, item_ids=claim, worker=holder, lease_s=lease_s, max_attempts=max_attempts
        )
    return done, gone, claimed
