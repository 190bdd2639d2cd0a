"""The OpenAI Batches API's rows: a batch made, found, paged, and what its object reads of its job.

Keyword-only functions taking a Session, as the rest of the store; ``genjob.batches`` decides what a
batch is (its request, its status, its OpenAI object) and calls these for every row it reads or
writes. Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from genjob.echo import echoed
from genjob.tables import Batch, Job, Result

RECENT_LIMIT = 10  # the newest candidates a retried create compares with


class BatchNotFound(LookupError):
    def __init__(self, batch_id: str) -> None:
        super().__init__(f"no batch {echoed(batch_id)}")
        self.batch_id = batch_id


def add_batch(session: Session, **columns: Any) -> Batch:
    """Insert a batch row (``columns``: ``tables.Batch``'s) and flush it (its id is then taken)."""
    batch = Batch(**columns)
    session.add(batch)
    session.flush()
    return batch


def recent_same_batch(
    session: Session,
    *,
    owner: str,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: dict[str, str] | None,
    since: datetime,
) -> str | None:
    """The id of this owner's newest batch made since ``since`` with the same request, if any."""
    query = (
        select(Batch)
        .where(
            Batch.owner == owner,
            Batch.input_file_id == input_file_id,
            Batch.endpoint == endpoint,
            Batch.completion_window == completion_window,
            Batch.created_at >= since,
        )
        .order_by(Batch.created_at.desc())
        .limit(RECENT_LIMIT)
    )
    for batch in session.scalars(query):
        if (batch.batch_metadata or None) == (metadata or None):
            return batch.id
    return None


def get_batch(session: Session, *, batch_id: str, owner: str | None) -> Batch:
    """The batch, read anew; BatchNotFound if there is none, or it is another owner's."""
    batch = session.get(Batch, batch_id, populate_existing=True)
    if batch is None or owner not in (None, batch.owner):
        raise BatchNotFound(batch_id)
    return batch


def list_batches(
    session: Session, *, owner: str | None, after: str | None, limit: int
) -> tuple[Sequence[Batch], bool]:
    """A page of batches, newest first, after the batch ``after``; and whether more follow."""
    query = select(Batch)
    if owner is not None:
        query = query.where(Batch.owner == owner)
    if after is not None:
        mark = get_batch(session, batch_id=after, owner=owner)
        query = query.where(tuple_(Batch.created_at, Batch.id) < tuple_(mark.created_at, mark.id))
    rows = session.scalars(query.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit + 1)).all()
    return rows[:limit], len(rows) > limit


def batch_job(session: Session, *, batch: Batch) -> Job | None:
    """The batch's job, read anew (None: the batch failed before it had one)."""
    return session.get(Job, batch.job_id, populate_existing=True) if batch.job_id else None


def prompt_tokens(session: Session, *, job_id: str) -> int:
    """The prompt tokens of the job's results (its batch's ``usage.input_tokens``)."""
    query = select(func.coalesce(func.sum(Result.prompt_tokens), 0)).where(Result.job_id == job_id)
    return int(session.scalar(query) or 0)
