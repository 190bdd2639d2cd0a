"""Run one chunk of a job: lease its items, run them through the job's engine, record what it measured.

Sits between the Celery task (which only passes ids) and the engine (which only sees token ids): it
owns the database writes and the per-process cache of job runners. The items go through the one
item loop (``genjob.worker.item_loop``); at the end the engine's measurements of the chunk (rounds,
plain probe rounds, prefill, the worker's busy time, the γ histogram) are added to the job, and the
job's expected speedup is derived again from its sums and the costs this worker measured.

Reliability: the chunk's items are leased to this process (renewed by a ``LeaseKeeper`` thread), so
no other worker runs them while it lives and the sweeper takes them back once it dies. Every database
write is a short transaction retried with backoff on a dropped connection.
Must not know: HTTP, the CLI.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from sqlalchemy.orm import Session

from genjob import store
from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.db import run_transaction
from genjob.generation.costs import expected_speedup
from genjob.generation.engine_stats import EngineStats
from genjob.generation.loading import ModelLoadError
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.store import leases
from genjob.tables import Job
from genjob.worker.item_loop import ChunkContext, ChunkOutcome, ItemLoop
from genjob.worker.leasing import LeaseKeeper, lease_holder
from genjob.worker.metrics import metered
from genjob.worker.provenance import note_once
from genjob.worker.runners import RUNNERS, JobRunner

log = logging.getLogger(__name__)


def _open_chunk(
    session: Session, *, job_id: str, item_ids: list[int], holder: str, settings: Settings
) -> tuple[JobSpec, list[int], str] | None:
    """(spec, the chunk's items now leased to us, in order, the job's queue), or None if the job ended."""
    job = session.get(Job, job_id)
    if job is None or job.status in TERMINAL_JOB_STATUSES:
        return None
    if job.expires_at is not None and store.expire_due_jobs(session, job_id=job_id):
        return None
    store.mark_job_running(session, job_id=job_id)
    reserved = leases.reserve_items(session, item_ids=item_ids, worker=holder, lease_s=settings.lease_s)
    spec = JobSpec.model_validate(job.spec)
    return spec, [item_id for item_id in item_ids if item_id in reserved], job.queue


def measurements(
    stats: EngineStats, *, busy_seconds: float, draft_tokens: int | None
) -> store.ChunkMeasurements:
    return store.ChunkMeasurements(
        busy_seconds=busy_seconds,
        decode_rounds=stats.rounds,
        decode_rows=stats.rows_sum,
        decode_tokens=stats.tokens,
        decode_seconds=stats.seconds,
        probe_rounds=stats.probe_rounds,
        probe_tokens=stats.probe_tokens,
        probe_seconds=stats.probe_seconds,
        probe_sq=stats.probe_sq,
        prefill_seconds=stats.prefill_seconds,
        gamma_hist=dict(stats.gamma_hist),
        draft_tokens=draft_tokens,
    )


def _close_chunk(
    session: Session,
    *,
    job_id: str,
    item_ids: list[int],
    holder: str,
    measured: store.ChunkMeasurements | None,
    runner: JobRunner | None,
) -> None:
    leases.release_reservations(session, item_ids=item_ids, worker=holder)
    if measured is not None and runner is not None:
        job = store.record_chunk(session, job_id=job_id, measured=measured)
        if job is not None:
            _derive(job, runner)
    store.finalize_job(session, job_id=job_id)


def _derive(job: Job, runner: JobRunner) -> None:
    """The job's expected speedup, cost ratio and costs at its mean batch size, from its new sums."""
    hist = {int(k): n for k, n in (job.gamma_hist or {}).items()}
    if runner.engine.proposer is None or not hist:
        return
    costs = runner.engine.costs
    batch = job.decode_rows / job.decode_rounds if job.decode_rounds else 1.0
    tried = job.draft_accepted + job.draft_rejections
    alpha = job.draft_accepted / tried if tried else 0.0
    job.expected_speedup = expected_speedup(costs, alpha, hist, batch)
    plain = costs.verify_seconds(max(1, round(batch)), 1)
    job.cost_ratio = costs.draft_seconds(max(1, round(batch))) / plain
    summary: dict[str, Any] = costs.as_dict()
    summary["at_batch"] = costs.at_batch(batch, sorted(hist))
    job.costs = summary


def process_chunk(*, settings: Settings, job_id: str, item_ids: list[int], worker: str) -> ChunkOutcome:
    """Generate every open item of the chunk; stop claiming if the job ends meanwhile."""
    tx = functools.partial(run_transaction, settings.database_url, retry_s=settings.db_retry_s)
    holder = lease_holder(worker)
    outcome = ChunkOutcome()
    opened = tx(_open_chunk, job_id=job_id, item_ids=item_ids, holder=holder, settings=settings)
    if opened is None:
        outcome.skipped, outcome.stopped = len(item_ids), True
        return outcome
    spec, mine, queue = opened
    outcome.skipped = len(item_ids) - len(mine)  # final, or held by another live worker
    if not mine:
        tx(store.finalize_job, job_id=job_id)
        return outcome
    started = time.perf_counter()
    runner: JobRunner | None = None
    measured = None
    # The leases are renewed from here on: loading the models may take longer than a lease.
    with LeaseKeeper(settings, item_ids=mine, holder=holder):
        try:
            runner = RUNNERS.get(job_id, spec, settings=settings)
        except ModelLoadError as exc:
            log.error("job %s: %s", job_id, exc)
            tx(store.fail_job, job_id=job_id, error=str(exc))
            outcome.stopped = True
            return outcome
        note_once(tx, job_id=job_id, spec=spec)
        context = ChunkContext(settings=settings, job_id=job_id, holder=holder, worker=worker, tx=tx)
        labels = {"model": spec.model, "queue": queue, "mode": spec.mode.value, "worker": worker}
        with metered(runner.engine, outcome, **labels):
            ItemLoop(runner, context, outcome).run(mine)
        engine = getattr(runner, "engine", None)
        if engine is not None:
            busy = time.perf_counter() - started
            k = engine.k if engine.proposer is not None else None
            measured = measurements(engine.stats.take(), busy_seconds=busy, draft_tokens=k)
    tx(_close_chunk, job_id=job_id, item_ids=mine, holder=holder, measured=measured, runner=runner)
    return outcome
