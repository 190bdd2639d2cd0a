"""Run one chunk of a job: claim each item, generate, write the result; cooperative cancel.

Sits between the Celery task (which only passes ids) and the engine (which only sees token ids):
it owns the database writes and the per-process caches of models and per-job engines.

Measured speedup: every ``1/baseline_fraction``-th item (the job's first item always) is also
decoded plainly by the target, right after its assisted decode, in the same process; the job sums
both times over that sample (speedup = plain / assisted) and counts greedy outputs that match
(the lossless rate). Speedup guard: once ``guard_min_items`` sampled items (or every sampled item
of a small job) show a speedup under ``guard_threshold``, the rest of the job decodes plainly and
the job records that it did and why.

Batched: a chunk of several items of a greedy draft/none job goes through ``genjob.generation.batched``
(``genjob.worker.batched_chunks``): items are claimed as batch slots free up and written as they finish.

Reliability: the chunk's items are leased to this process (renewed by a ``LeaseKeeper`` thread),
so no other worker runs them while it lives and the sweeper takes them back once it dies. Every
database write is a short transaction retried with backoff on a dropped connection. An item that
raises is tried again up to ``max_attempts`` times, then failed with its error; the job goes on.
Before each item the chunk stops if the job was cancelled or its deadline passed.
"""

from __future__ import annotations

import functools
import logging
import math

from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import TERMINAL_JOB_STATUSES, DecodingMode
from genjob.db import run_transaction
from genjob.generation.loading import ModelLoadError
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.store import leases
from genjob.tables import Job
from genjob.worker.batched_chunks import batch_size_for, run_batched
from genjob.worker.items import ChunkContext, ChunkOutcome, run_item
from genjob.worker.leasing import LeaseKeeper, lease_holder
from genjob.worker.runners import RUNNERS

log = logging.getLogger(__name__)


def _open_chunk(
    session: Session, *, job_id: str, item_ids: list[int], holder: str, settings: Settings
) -> tuple[JobSpec, list[int], int | None, int] | None:
    """(spec, the chunk's items now leased to us in order, learned γ, guard sample size), or None
    if the job ended."""
    job = session.get(Job, job_id)
    if job is None or job.status in TERMINAL_JOB_STATUSES:
        return None
    if job.expires_at is not None and store.expire_due_jobs(session, job_id=job_id):
        return None
    store.mark_job_running(session, job_id=job_id)
    reserved = leases.reserve_items(session, item_ids=item_ids, worker=holder, lease_s=settings.lease_s)
    spec = JobSpec.model_validate(job.spec)
    mine = [item_id for item_id in item_ids if item_id in reserved]
    return spec, mine, job.draft_tokens, guard_sample_size(settings, job, spec)


def _close_chunk(
    session: Session, *, job_id: str, item_ids: list[int], holder: str, draft_tokens: int | None
) -> None:
    leases.release_reservations(session, item_ids=item_ids, worker=holder)
    if draft_tokens is not None:
        session.get_one(Job, job_id).draft_tokens = draft_tokens
    store.finalize_job(session, job_id=job_id)


def guard_sample_size(settings: Settings, job: Job, spec: JobSpec) -> int:
    """How many sampled items the guard waits for: its minimum, or all the job will ever have."""
    if spec.baseline_fraction <= 0:
        return 0
    samples = math.ceil(job.total / max(1, round(1 / spec.baseline_fraction)))
    return max(1, min(settings.guard_min_items, samples))


def process_chunk(
    *,
    settings: Settings,
    job_id: str,
    item_ids: list[int],
    worker: str,
) -> ChunkOutcome:
    """Generate every open item of the chunk in order; stop early if the job ends meanwhile."""
    tx = functools.partial(run_transaction, settings.database_url, retry_s=settings.db_retry_s)
    holder = lease_holder(worker)
    outcome = ChunkOutcome()
    opened = tx(_open_chunk, job_id=job_id, item_ids=item_ids, holder=holder, settings=settings)
    if opened is None:
        outcome.skipped, outcome.stopped = len(item_ids), True
        return outcome
    spec, mine, draft_tokens, guard_after = opened
    outcome.skipped = len(item_ids) - len(mine)  # final, or held by another live worker
    if not mine:
        tx(store.finalize_job, job_id=job_id)
        return outcome
    # The leases are renewed from here on: loading the models may take longer than a lease.
    with LeaseKeeper(settings, item_ids=mine, holder=holder):
        try:
            runner = RUNNERS.get(
                job_id,
                spec,
                device=settings.device,
                draft_tokens=draft_tokens,
            )
        except ModelLoadError as exc:
            log.error("job %s: %s", job_id, exc)
            tx(store.fail_job, job_id=job_id, error=str(exc))
            outcome.stopped = True
            return outcome
        tx(store.record_cost_ratio, job_id=job_id, cost_ratio=runner.cost_ratio)
        context = ChunkContext(settings=settings, job_id=job_id, holder=holder, worker=worker, tx=tx)
        batch_size = batch_size_for(runner, settings) if len(mine) > 1 else 1
        if batch_size > 1:
            run_batched(
                runner, mine, context=context, guard_after=guard_after, outcome=outcome, size=batch_size
            )
        else:
            for item_id in mine:
                if not run_item(runner, item_id, context=context, guard_after=guard_after, outcome=outcome):
                    outcome.stopped = True
                    break

    learned = runner.engine.draft_tokens if runner.spec.mode is DecodingMode.DRAFT else None
    tx(_close_chunk, job_id=job_id, item_ids=mine, holder=holder, draft_tokens=learned)
    return outcome
