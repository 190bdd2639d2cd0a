"""One item of a chunk: claim it, decode it, write its result or its error; retries with backoff.

Shared by the one-at-a-time and the batched paths of a chunk. Must not know: torch, HTTP.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from genjob import store
from genjob.settings import Settings
from genjob.tables import Item, Job
from genjob.worker.runners import PERMANENT_ITEM_ERRORS, ItemOutput, JobRunner

log = logging.getLogger(__name__)

MAX_RETRY_BACKOFF_S = 60.0


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stopped: bool = False


def retry_delay(settings: Settings, attempts: int) -> float:
    """Backoff before try ``attempts + 1``: retry_backoff_s, then doubling, at most a minute."""
    return min(settings.retry_backoff_s * 2 ** (attempts - 1), MAX_RETRY_BACKOFF_S)


@dataclass(frozen=True)
class ChunkContext:
    settings: Settings
    job_id: str
    holder: str  # the lease holder: worker name / pid
    worker: str
    tx: Callable[..., Any]


def claim(session: Session, *, item_id: int, holder: str, settings: Settings):
    """Claim the item; with it, whether the speedup guard switched the job to plain decoding."""
    claimed = store.claim_item(
        session, item_id=item_id, worker=holder, lease_s=settings.lease_s, max_attempts=settings.max_attempts
    )
    if isinstance(claimed, store.Refused):
        return claimed, False
    plain_only = session.scalar(select(Job.guard_tripped).where(Job.id == claimed[0].job_id))
    return claimed, bool(plain_only)


def finish(
    session: Session,
    *,
    item: Item,
    attempt_id: int,
    output: ItemOutput,
    context: ChunkContext,
    guard_after: int,
):
    finished = store.finish_item(
        session, item=item, attempt_id=attempt_id, result=output.result_row(context.worker)
    )
    if finished and output.baseline is not None:
        store.check_speedup_guard(
            session, job_id=context.job_id, min_items=guard_after, threshold=context.settings.guard_threshold
        )
    return finished


def run_item(
    runner: JobRunner, item_id: int, *, context: ChunkContext, guard_after: int, outcome: ChunkOutcome
) -> bool:
    """Claim, generate and record one item, trying again after an error; False: stop the chunk."""
    settings, tx, job_id = context.settings, context.tx, context.job_id
    while True:
        claimed, plain_only = tx(claim, item_id=item_id, holder=context.holder, settings=settings)
        if claimed is store.Refused.JOB_ENDED:
            return False
        if isinstance(claimed, store.Refused):
            outcome.skipped += 1
            return True
        item, attempt_id = claimed
        try:
            output = runner.decode(item, plain_only=plain_only)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, PERMANENT_ITEM_ERRORS) or item.attempts >= settings.max_attempts:
                if item.attempts > 1:
                    error += f" (attempt {item.attempts} of {settings.max_attempts})"
                log.warning("job %s item %s failed: %s\n%s", job_id, item.seq, error, traceback.format_exc())
                tx(store.fail_item, item=item, attempt_id=attempt_id, error=error)
                outcome.failed += 1
                return True
            delay = retry_delay(settings, item.attempts)
            log.warning(
                "job %s item %s: %s; try %d of %d in %.1f s",
                job_id,
                item.seq,
                error,
                item.attempts + 1,
                settings.max_attempts,
                delay,
            )
            tx(store.release_for_retry, item=item, attempt_id=attempt_id, error=error)
            outcome.retried += 1
            time.sleep(delay)
            continue
        if tx(
            finish, item=item, attempt_id=attempt_id, output=output, context=context, guard_after=guard_after
        ):
            outcome.done += 1
        else:
            log.warning(
                "job %s item %s: finished after its lease was taken over; result dropped", job_id, item.seq
            )
        return True


def fail(context: ChunkContext, item: Item, attempt_id: int, exc: Exception, outcome: ChunkOutcome) -> None:
    """Fail an item at once (an error no other try can fix)."""
    error = f"{type(exc).__name__}: {exc}"
    log.warning("job %s item %s failed: %s\n%s", item.job_id, item.seq, error, traceback.format_exc())
    context.tx(store.fail_item, item=item, attempt_id=attempt_id, error=error)
    outcome.failed += 1
