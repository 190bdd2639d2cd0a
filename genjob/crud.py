"""Database operations on jobs, items and results: keyword-only functions taking a Session.

Item writes are idempotent: an item moves to a final status at most once (a conditional UPDATE),
and only that transition writes its result (an upsert on (job_id, item_id)) and bumps the job's
counters, all in one transaction. A redelivered chunk therefore skips finished items and never
counts one twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from genjob.constants import OPEN_ITEM_STATUSES, TERMINAL_JOB_STATUSES, ItemStatus, JobStatus
from genjob.inputs import PromptItem
from genjob.jobspec import JobSpec
from genjob.models import Attempt, Item, Job, Result, utcnow

INSERT_BATCH = 2000


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
    """Insert a job and all its items (streamed, in bulk batches) in the caller's transaction."""
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
    total = 0
    for batch in batched(items, INSERT_BATCH):
        rows = [
            {
                "job_id": job.id,
                "seq": item.seq,
                "line": item.line,
                "custom_id": item.custom_id,
                "prompt": item.prompt,
                "max_new_tokens": item.max_new_tokens,
                "status": ItemStatus.PENDING,
                "attempts": 0,
            }
            for item in batch
        ]
        session.execute(insert(Item), rows)
        total += len(rows)
    job.total = total
    session.flush()
    return job


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


def pending_item_chunks(session: Session, *, job_id: str, chunk_size: int) -> Iterator[list[int]]:
    """Ids of the job's pending items, in input order, in chunks of ``chunk_size``."""
    ids = session.scalars(
        select(Item.id).where(Item.job_id == job_id, Item.status == ItemStatus.PENDING).order_by(Item.seq)
    )
    for chunk in batched(ids, chunk_size):
        yield list(chunk)


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


def claim_item(session: Session, *, item_id: int, worker: str) -> tuple[Item, int] | None:
    """Start an attempt on an open item of a live job; None if it is finished or its job ended."""
    item = session.get(Item, item_id, with_for_update=True)
    if item is None or item.status not in OPEN_ITEM_STATUSES:
        return None
    item.status = ItemStatus.RUNNING
    item.attempts += 1
    item.started_at = utcnow()
    attempt = Attempt(item_id=item.id, worker=worker)
    session.add(attempt)
    session.flush()
    return item, attempt.id


def _upsert(session: Session, values: dict[str, Any]) -> None:
    dialect = session.get_bind().dialect.name
    module = postgresql if dialect == "postgresql" else sqlite
    statement = module.insert(Result).values(**values)
    changed = {key: statement.excluded[key] for key in values if key not in ("job_id", "item_id")}
    session.execute(statement.on_conflict_do_update(index_elements=["job_id", "item_id"], set_=changed))


def finish_item(session: Session, *, item: Item, attempt_id: int, result: dict[str, Any]) -> bool:
    """Record a finished item once: result upserted, counters bumped; False if it was already final."""
    moved = session.execute(
        update(Item)
        .where(Item.id == item.id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .values(status=ItemStatus.DONE, error=None, finished_at=utcnow())
    ).rowcount
    _close_attempt(session, attempt_id=attempt_id, outcome=ItemStatus.DONE)
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
    moved = session.execute(
        update(Item)
        .where(Item.id == item.id, Item.status.in_(list(OPEN_ITEM_STATUSES)))
        .values(status=ItemStatus.FAILED, error=error, finished_at=utcnow())
    ).rowcount
    _close_attempt(session, attempt_id=attempt_id, outcome=ItemStatus.FAILED, error=error)
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
