"""Database operations on jobs, items and results: keyword-only functions taking a Session.

Item writes are idempotent: an item moves to a final status at most once (a conditional UPDATE),
and only that transition writes its result (an upsert on (job_id, item_id)) and bumps the job's
counters, all in one transaction. A redelivered chunk therefore skips finished items and never
counts one twice.

Leases (``genjob.leases``) keep two workers off one item; ``attempts`` is the fencing token: a finish
or failure counts only if no later attempt has claimed the item meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from itertools import islice
from typing import Any

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from genjob.constants import (
    OPEN_ITEM_STATUSES,
    TERMINAL_JOB_STATUSES,
    AttemptOutcome,
    ItemStatus,
    JobStatus,
)
from genjob.inputs import PromptItem
from genjob.jobspec import JobSpec
from genjob.leases import as_utc, close_open_attempts, lease_is_free
from genjob.models import Attempt, Item, Job, Result, utcnow

INSERT_BATCH = 2000
PAGE_SIZE = 5000


class JobNotFound(LookupError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job {job_id!r}")
        self.job_id = job_id


def batched(iterable: Iterable, size: int) -> Iterator[tuple]:
    """itertools.batched (Python 3.12) for 3.11."""
    iterator = iter(iterable)
    while batch := tuple(islice(iterator, size)):
        yield batch


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
) -> Job:
    """Insert a job and all its items in the caller's transaction, streamed in flat memory.

    Postgres (psycopg) gets one ``COPY items FROM STDIN``; other databases executemany batches.
    """
    job = Job(
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
    rows = (
        (job.id, item.seq, item.line, item.custom_id, item.prompt, item.max_new_tokens, ItemStatus.PENDING, 0)
        for item in items
    )
    if session.get_bind().dialect.driver == "psycopg":
        job.total = _copy_items(session, rows)
    else:
        job.total = 0
        for batch in batched(rows, INSERT_BATCH):
            session.execute(insert(Item), [dict(zip(ITEM_COLUMNS, row, strict=True)) for row in batch])
            job.total += len(batch)
    session.flush()
    return job


ITEM_COLUMNS = ("job_id", "seq", "line", "custom_id", "prompt", "max_new_tokens", "status", "attempts")


def _copy_items(session: Session, rows: Iterable[tuple]) -> int:
    """Stream rows into ``items`` with COPY (about 3x faster than executemany); returns the count."""
    count = 0
    cursor = session.connection().connection.cursor()
    try:
        with cursor.copy(f"COPY items ({', '.join(ITEM_COLUMNS)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                count += 1
    finally:
        cursor.close()
    return count


def get_job(session: Session, *, job_id: str) -> Job:
    """The job with this id, or the only job whose id starts with it."""
    job = session.get(Job, job_id)
    if job is not None:
        return job
    matches = session.scalars(select(Job).where(Job.id.startswith(job_id, autoescape=True)).limit(2)).all()
    if len(matches) == 1:
        return matches[0]
    raise JobNotFound(job_id)


def list_jobs(
    session: Session, *, status: str | None = None, limit: int = 50, offset: int = 0
) -> Sequence[Job]:
    query = select(Job).order_by(Job.created_at.desc(), Job.id)
    if status:
        query = query.where(Job.status == status)
    return session.scalars(query.limit(limit).offset(offset)).all()


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


def live_jobs_with_pending_items(session: Session) -> list[tuple[str, str]]:
    """(job id, queue) of every job that has not ended and still has pending items."""
    has_pending = select(Item.id).where(Item.job_id == Job.id, Item.status == ItemStatus.PENDING).exists()
    query = select(Job.id, Job.queue).where(Job.status.not_in(list(TERMINAL_JOB_STATUSES)), has_pending)
    return [(job_id, queue) for job_id, queue in session.execute(query.order_by(Job.created_at))]


def cancel_job(session: Session, *, job: Job) -> bool:
    """Cancel a job that has not ended: pending items are cancelled, the one in flight finishes."""
    moved = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .values(status=JobStatus.CANCELLED, finished_at=utcnow())
    ).rowcount
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
    failed = session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .values(status=ItemStatus.FAILED, error=error, finished_at=utcnow())
    ).rowcount
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
        .values(status=JobStatus.FAILED, error=error, failed=Job.failed + failed, finished_at=utcnow())
    )


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
    attempt = Attempt(item_id=item.id, worker=worker, started_at=now)
    session.add(attempt)
    session.flush()
    return item, attempt.id


def _held_by_this_attempt(item: Item):
    """SQL condition: still running under the attempt that claimed ``item`` (the fencing token)."""
    return and_(Item.id == item.id, Item.status == ItemStatus.RUNNING, Item.attempts == item.attempts)


def release_for_retry(session: Session, *, item: Item, attempt_id: int, error: str) -> bool:
    """An attempt raised and tries are left: the item goes back to pending, still leased to us."""
    moved = session.execute(
        update(Item).where(_held_by_this_attempt(item)).values(status=ItemStatus.PENDING, error=error)
    ).rowcount
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
    moved = session.execute(
        update(Item)
        .where(_held_by_this_attempt(item))
        .values(status=ItemStatus.DONE, error=None, finished_at=utcnow(), lease_expires_at=None)
    ).rowcount
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
        "generate_seconds": Job.generate_seconds + result["latency_s"],
    }
    if result.get("baseline_latency_s") is not None:
        sums |= {
            "baseline_items": Job.baseline_items + 1,
            "baseline_seconds": Job.baseline_seconds + result["baseline_latency_s"],
            "baseline_assisted_seconds": Job.baseline_assisted_seconds + result["latency_s"],
            "baseline_matches": Job.baseline_matches + int(bool(result.get("baseline_match"))),
        }
    session.execute(update(Job).where(Job.id == item.job_id).values(**sums))
    return True


def record_cost_ratio(session: Session, *, job_id: str, cost_ratio: float | None) -> None:
    """Keep the first measured c = draft forward / target forward on the job."""
    if cost_ratio is not None:
        session.execute(
            update(Job).where(Job.id == job_id, Job.cost_ratio.is_(None)).values(cost_ratio=cost_ratio)
        )


def check_speedup_guard(session: Session, *, job_id: str, min_items: int, threshold: float) -> bool:
    """Switch the rest of the job to plain decoding if the A/B so far shows no speedup."""
    job = session.get(Job, job_id, populate_existing=True)
    if (
        job is None
        or job.guard_tripped
        or job.baseline_items < min_items
        or not job.baseline_assisted_seconds
    ):
        return False
    speedup = job.baseline_seconds / job.baseline_assisted_seconds
    if speedup >= threshold:
        return False
    job.guard_tripped = True
    job.guard_reason = (
        f"measured speedup {speedup:.2f}x < {threshold:.2f}x on the first {job.baseline_items} sampled items "
        f"(assisted {job.baseline_assisted_seconds:.3f} s vs plain {job.baseline_seconds:.3f} s): "
        "the remaining items use plain decoding"
    )
    return True


def fail_item(session: Session, *, item: Item, attempt_id: int, error: str) -> bool:
    """Mark an item failed with its error, once (fenced like ``finish_item``)."""
    moved = session.execute(
        update(Item)
        .where(_held_by_this_attempt(item))
        .values(status=ItemStatus.FAILED, error=error, finished_at=utcnow(), lease_expires_at=None)
    ).rowcount
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


def finalize_job(session: Session, *, job_id: str) -> str | None:
    """End a running job whose items are all final; return its new status, or None if still open."""
    open_items = session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.job_id == job_id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
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
        error = f"expired: not finished by {as_utc(expires_at):%Y-%m-%d %H:%M:%S} UTC"
        moved = session.execute(
            update(Job)
            .where(Job.id == due_id, Job.status.not_in(list(TERMINAL_JOB_STATUSES)))
            .values(status=JobStatus.EXPIRED, error=error, finished_at=now)
        ).rowcount
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
    is queued again (its deadline is ``expires_at``, none by default).
    """
    if job.status not in RETRYABLE_JOB_STATUSES:
        raise ValueError(
            f"job {job.id} ended {job.status}: only failed items of a live, completed or "
            "failed job are retried"
        )
    retried = session.execute(
        update(Item)
        .where(Item.job_id == job.id, Item.status == ItemStatus.FAILED)
        .values(
            status=ItemStatus.PENDING,
            attempts=0,
            error=None,
            finished_at=None,
            claimed_by=None,
            lease_expires_at=None,
        )
    ).rowcount
    if retried:
        values: dict[str, Any] = {"failed": Job.failed - retried}
        if job.status in TERMINAL_JOB_STATUSES:
            values.update(status=JobStatus.QUEUED, error=None, finished_at=None, expires_at=expires_at)
        session.execute(update(Job).where(Job.id == job.id).values(**values))
        session.refresh(job)
    return retried


def iter_results(session: Session, *, job_id: str) -> Iterator[tuple[Item, Result | None]]:
    """Every item of the job in input order, with its result where it has one (streamed)."""
    query = (
        select(Item, Result)
        .outerjoin(Result, Result.item_id == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.seq)
        .execution_options(yield_per=1000)
    )
    for row in session.execute(query):
        yield row.tuple()


@dataclass(frozen=True)
class JobStats:
    acceptance_rate: float | None
    mean_accepted_per_round: float | None
    tokens_per_second: float | None
    measured_speedup: float | None
    expected_speedup: float | None
    lossless_rate: float | None


def expected_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Leviathan et al. 2023, eq. 1: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); the limit γ+1 at α = 1."""
    if alpha >= 1.0:
        return (gamma + 1) / (gamma * cost_ratio + 1)
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * cost_ratio + 1))


def iid_acceptance(tokens_per_round: float, gamma: int) -> float:
    """The per-token acceptance probability α of Leviathan et al.'s i.i.d. model that yields the
    observed mean tokens per round: solve (1 − α^(γ+1)) / (1 − α) = tokens_per_round by bisection."""
    if tokens_per_round >= gamma + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if sum(mid**k for k in range(gamma + 1)) < tokens_per_round:
            low = mid
        else:
            high = mid
    return low


def job_stats(job: Job) -> JobStats:
    """Aggregates of a job. The acceptance rate shown is accepted / proposed. The expected speedup
    applies Leviathan et al.'s formula with γ = the mean tokens proposed per round (the heuristic
    schedule varies it), the measured c, and the i.i.d. α that explains the observed tokens per round
    (accepted / proposed understates it when γ runs long)."""
    alpha = job.draft_accepted / job.draft_proposed if job.draft_proposed else None
    expected = None
    if alpha is not None and job.target_rounds and job.cost_ratio is not None:
        gamma = max(1, round(job.draft_proposed / job.target_rounds))
        tokens_per_round = (job.target_rounds + job.draft_accepted) / job.target_rounds
        expected = expected_speedup(iid_acceptance(tokens_per_round, gamma), gamma, job.cost_ratio)
    greedy = not (job.spec or {}).get("temperature")
    return JobStats(
        acceptance_rate=alpha,
        mean_accepted_per_round=job.draft_accepted / job.target_rounds if job.target_rounds else None,
        tokens_per_second=job.new_tokens / job.generate_seconds if job.generate_seconds else None,
        measured_speedup=(
            job.baseline_seconds / job.baseline_assisted_seconds if job.baseline_assisted_seconds else None
        ),
        expected_speedup=expected,
        lossless_rate=job.baseline_matches / job.baseline_items if job.baseline_items and greedy else None,
    )
