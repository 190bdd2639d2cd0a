"""Item transitions: claim, finish (with the result and the job's sums), fail, release for retry.

An item moves to a final status at most once (a conditional UPDATE fenced by ``attempts``, the
attempt counter: only the attempt that claimed the item last may finish it), and only that
transition writes its result (an upsert on (job_id, item_id)) and bumps the job's counters, all in
one transaction, so a redelivered chunk skips finished items and never counts one twice.
Must not know: Celery, torch, the HTTP API.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, and_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from genjob.constants import (
    OPEN_ITEM_STATUSES,
    TERMINAL_JOB_STATUSES,
    AttemptOutcome,
    ItemStatus,
)
from genjob.db import changed_rows
from genjob.store.jobs import expire_due_jobs
from genjob.store.leases import as_utc, close_open_attempts
from genjob.tables import Attempt, Item, Job, Result, utcnow


class Refused(StrEnum):
    """Why ``claim_item`` did not claim an item."""

    FINAL = "final"  # done, failed, cancelled or expired already
    LEASED = "leased"  # another live worker holds it
    GAVE_UP = "gave up"  # it used all its tries: now failed
    JOB_ENDED = "job ended"  # its job was cancelled, failed or expired: the chunk stops


def claim_item(
    session: Session,
    *,
    item_id: int,
    worker: str,
    lease_s: float,
    max_attempts: int,
    now: datetime | None = None,
) -> tuple[Item, int] | Refused:
    """Start an attempt on an open item of a live job: (item, attempt id), or why not.

    The item's row is locked, so two workers can never both claim it. The job's row is share-
    locked first (the order cancel and expiry lock them in), so a cancel waits for claims under
    way and every later claim sees it: no item starts after a cancel commits. A running item is
    taken over only once its lease ran out (its worker died); its open attempt is then closed as
    lost. An item that already used ``max_attempts`` (say, it kills the worker every time) is
    failed. A job past its deadline is expired here.
    """
    now = now or utcnow()
    job_row = session.execute(
        select(Job.status, Job.expires_at)
        .join(Item, Item.job_id == Job.id)
        .where(Item.id == item_id)
        .with_for_update(read=True, of=Job)
    ).one_or_none()
    item = session.get(Item, item_id, with_for_update=True, populate_existing=True)
    if job_row is None or item is None:
        return Refused.FINAL
    job_status, expires_at = job_row
    if job_status in TERMINAL_JOB_STATUSES:
        return Refused.JOB_ENDED
    if (
        expires_at is not None
        and as_utc(expires_at) <= now
        and expire_due_jobs(session, now=now, job_id=item.job_id)
    ):
        return Refused.JOB_ENDED
    if item.status not in OPEN_ITEM_STATUSES:
        return Refused.FINAL
    lease_live = item.lease_expires_at is not None and as_utc(item.lease_expires_at) > now
    if item.claimed_by not in (None, worker) and lease_live:
        return Refused.LEASED
    if item.status == ItemStatus.RUNNING:
        close_open_attempts(session, item_id=item.id, now=now)  # a try whose worker died
    if item.attempts >= max_attempts:
        error = f"gave up after {item.attempts} attempts; last: {item.error or 'its worker was lost'}"
        item.status, item.error, item.finished_at, item.lease_expires_at = ItemStatus.FAILED, error, now, None
        session.execute(update(Job).where(Job.id == item.job_id).values(failed=Job.failed + 1))
        session.flush()
        return Refused.GAVE_UP
    item.status = ItemStatus.RUNNING
    item.attempts += 1
    item.started_at = now
    item.claimed_by = worker
    item.lease_expires_at = now + timedelta(seconds=lease_s)
    attempt = Attempt(job_id=item.job_id, item_id=item.id, worker=worker, started_at=now)
    session.add(attempt)
    session.flush()
    return item, attempt.id


def _held_by_this_attempt(item: Item) -> ColumnElement[bool]:
    """SQL condition: still running under the attempt that claimed ``item`` (the fencing token)."""
    return and_(Item.id == item.id, Item.status == ItemStatus.RUNNING, Item.attempts == item.attempts)


def release_for_retry(session: Session, *, item: Item, attempt_id: int, error: str) -> bool:
    """An attempt raised and tries are left: the item goes back to pending, still leased to us."""
    moved = changed_rows(
        session,
        update(Item).where(_held_by_this_attempt(item)).values(status=ItemStatus.PENDING, error=error),
    )
    _close_attempt(session, attempt_id=attempt_id, outcome=AttemptOutcome.RETRIED, error=error)
    return bool(moved)


def _upsert(session: Session, values: dict[str, Any]) -> None:
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    statement = module.insert(Result).values(**values)
    changed = {key: statement.excluded[key] for key in values if key not in ("job_id", "item_id")}
    session.execute(statement.on_conflict_do_update(index_elements=["job_id", "item_id"], set_=changed))


def finish_item(session: Session, *, item: Item, attempt_id: int, result: dict[str, Any]) -> bool:
    """Record a finished item once: result upserted, counters bumped.

    False (and nothing written but the attempt) if the item is already final or a later attempt
    took it over after this one's lease ran out.
    """
    moved = changed_rows(
        session,
        update(Item)
        .where(_held_by_this_attempt(item))
        .values(status=ItemStatus.DONE, error=None, finished_at=utcnow(), lease_expires_at=None),
    )
    outcome = AttemptOutcome.DONE if moved else AttemptOutcome.SUPERSEDED
    _close_attempt(session, attempt_id=attempt_id, outcome=outcome)
    if not moved:
        return False
    _upsert(session, {"job_id": item.job_id, "item_id": item.id, **result})
    sums = {
        "done": Job.done + 1,
        "new_tokens": Job.new_tokens + result["new_tokens"],
        "target_rounds": Job.target_rounds + result["target_rounds"],
        "draft_proposed": Job.draft_proposed + result["draft_proposed"],
        "draft_accepted": Job.draft_accepted + result["draft_accepted"],
        "draft_rejections": Job.draft_rejections + result["draft_rejections"],
        "generate_seconds": Job.generate_seconds + result["latency_s"],
    }
    if result.get("lossless_match") is not None:
        sums |= {
            "lossless_checked": Job.lossless_checked + 1,
            "lossless_matches": Job.lossless_matches + int(bool(result["lossless_match"])),
        }
    session.execute(update(Job).where(Job.id == item.job_id).values(**sums))
    return True


def fail_item(session: Session, *, item: Item, attempt_id: int, error: str) -> bool:
    """Mark an item failed with its error, once (fenced like ``finish_item``)."""
    moved = changed_rows(
        session,
        update(Item)
        .where(_held_by_this_attempt(item))
        .values(status=ItemStatus.FAILED, error=error, finished_at=utcnow(), lease_expires_at=None),
    )
    outcome = AttemptOutcome.FAILED if moved else AttemptOutcome.SUPERSEDED
    _close_attempt(session, attempt_id=attempt_id, outcome=outcome, error=error)
    if moved:
        session.execute(update(Job).where(Job.id == item.job_id).values(failed=Job.failed + 1))
    return bool(moved)


def _close_attempt(session: Session, *, attempt_id: int, outcome: str, error: str | None = None) -> None:
    session.execute(
        update(Attempt)
        .where(Attempt.id == attempt_id)
        .values(finished_at=utcnow(), outcome=outcome, error=error)
    )
