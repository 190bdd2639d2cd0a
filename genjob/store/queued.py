"""What a job has queued: its pending items as messages' ranges, the publisher's progress, and the
jobs whose publisher stopped half-way (for a sweeper to finish). Read a page at a time, flat memory
for any job size. Must not know: Celery, torch, transformers, the HTTP API or the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from sqlalchemy import Select, or_, select, update
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES, ItemStatus
from genjob.store.leases import lease_is_free
from genjob.tables import Item, Job, utcnow

PAGE_SIZE = 5000


def pending_item_chunks(
    session: Session, *, job_id: str, chunk_size: int, unleased_at: datetime | None = None
) -> Iterator[list[int]]:
    """Ids of the job's pending items, in input order, in chunks of ``chunk_size``.

    Read a page at a time (flat memory for any job size). With ``unleased_at``, items reserved
    by a worker whose lease is still live at that time are left out (they are in its chunk).
    """
    query = select(Item.id, Item.seq).where(Item.job_id == job_id, Item.status == ItemStatus.PENDING)
    if unleased_at is not None:
        query = query.where(lease_is_free(unleased_at))
    last_seq = -1
    chunk: list[int] = []
    while True:
        page = session.execute(query.where(Item.seq > last_seq).order_by(Item.seq).limit(PAGE_SIZE)).all()
        for item_id, seq in page:
            chunk.append(item_id)
            last_seq = seq
            if len(chunk) == chunk_size:
                yield chunk
                chunk = []
        if len(page) < PAGE_SIZE:
            break
    if chunk:
        yield chunk


def pending_ranges(
    session: Session, *, job_id: str, chunk_size: int, unleased_at: datetime | None = None
) -> Iterator[tuple[int, int]]:
    """The job's pending items as ``[start, stop)`` ranges of ``seq``, each spanning at most
    ``chunk_size`` positions (so at most that many items), in input order (``seq_runs``); read a
    page at a time. With ``unleased_at``, items reserved by a worker whose lease is still live then
    are left out."""
    query = select(Item.seq).where(Item.job_id == job_id, Item.status == ItemStatus.PENDING)
    if unleased_at is not None:
        query = query.where(lease_is_free(unleased_at))
    return seq_runs(_paged_seqs(session, query), chunk_size)


def _paged_seqs(session: Session, query: Select[int]) -> Iterator[int]:
    """The ``seq`` values ``query`` selects, in order, read ``PAGE_SIZE`` at a time."""
    last_seq = -1
    while True:
        page = session.scalars(query.where(Item.seq > last_seq).order_by(Item.seq).limit(PAGE_SIZE)).all()
        yield from page
        if len(page) < PAGE_SIZE:
            return
        last_seq = page[-1]


def seq_ranges(start: int, stop: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` cut into ranges of ``chunk_size``."""
    for first in range(start, stop, chunk_size):
        yield first, min(first + chunk_size, stop)


def seq_runs(seqs: Iterable[int], chunk_size: int) -> Iterator[tuple[int, int]]:
    """Sorted ``seqs`` as ``[start, stop)`` ranges, each spanning at most ``chunk_size`` positions."""
    start = stop = -1
    for seq in seqs:
        if start < 0:
            start = seq
        elif seq >= start + chunk_size:
            yield start, stop
            start = seq
        stop = seq + 1
    if start >= 0:
        yield start, stop


def record_queued(session: Session, *, job_id: str, queued_seq: int) -> None:
    """The publisher's progress: every item before ``queued_seq`` has its message (never goes back)."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.queued_seq < queued_seq)
        .values(queued_seq=queued_seq, queue_progress_at=utcnow())
    )


def take_over_stalled_queueing(
    session: Session, *, stalled_for_s: float, now: datetime | None = None
) -> list[tuple[str, str, int, int]]:
    """Live jobs whose publisher stopped before queueing every item (a submit killed mid-enqueue, a
    broker that was down): (id, queue, queued_seq, total) each, now taken over by the caller (its
    ``queue_progress_at`` is renewed, and the rows locked rows are skipped by other sweepers)."""
    now = now or utcnow()
    query = (
        select(Job.id, Job.queue, Job.queued_seq, Job.total)
        .where(
            Job.status.not_in(list(TERMINAL_JOB_STATUSES)),
            Job.queued_seq < Job.total,
            or_(
                Job.queue_progress_at.is_(None),
                Job.queue_progress_at <= now - timedelta(seconds=stalled_for_s),
            ),
        )
        .with_for_update(skip_locked=True)
    )
    stalled = [(job_id, queue, queued, total) for job_id, queue, queued, total in session.execute(query)]
    if stalled:
        session.execute(
            update(Job).where(Job.id.in_([row[0] for row in stalled])).values(queue_progress_at=now)
        )
    return stalled


def live_jobs_with_pending_items(session: Session) -> list[tuple[str, str]]:
    """(job id, queue) of every job that has not ended and still has pending items."""
    has_pending = select(Item.id).where(Item.job_id == Job.id, Item.status == ItemStatus.PENDING).exists()
    query = select(Job.id, Job.queue).where(Job.status.not_in(list(TERMINAL_JOB_STATUSES)), has_pending)
    return [(job_id, queue) for job_id, queue in session.execute(query.order_by(Job.created_at))]
