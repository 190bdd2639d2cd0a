"""Run one chunk of a job: lease its items, run them through the job's engine, record what it measured.

Sits between the Celery task (which only passes ids) and the engine (which only sees token ids): it
owns the database writes and the per-process cache of job runners. The items go through the one
item loop (``genjob.worker.item_loop``); at the end the engine's measurements of the chunk (rounds,
plain probe rounds, prefill, the worker's busy time, the γ histogram) are added to the job, and the
job's expected speedup is derived again from its sums and the costs this worker measured.

Reliability: the chunk's items are leased to this process (renewed by its ``LeaseRenewer`` thread while
the chunk makes progress), so no other worker runs them while it lives and moves, and the sweeper takes
them back once it dies or stalls. Every database write goes through the chunk's store
(``genjob.store.chunks``: short transactions, or on Postgres mostly one statement alone), retried
with backoff on a dropped connection; this module never knows which database it talks to. Faults
land where they belong: a model that cannot load fails the job; anything else that fails while this
worker holds items (its device, out of memory in warm-up, a bug) costs each held item a try and ends
its lease at once (``WorkerFault``), so a flapping worker cannot loop a job forever: after
``GENJOB_MAX_ATTEMPTS`` the items fail with the error and the job ends. A sticky device error (CUDA's
illegal memory access, a device-side assert: ``genjob.worker.devices``) is such a fault, marked
``sticky``: the task then ends this process, whose device would fail every later chunk.
Must not know: HTTP, the CLI.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from genjob import store
from genjob.db import RETRYABLE_DB_ERRORS
from genjob.generation.costs import expected_speedup
from genjob.generation.engine_stats import EngineStats
from genjob.generation.loading import ModelLoadError
from genjob.settings import Settings
from genjob.worker.devices import is_sticky_device_error
from genjob.worker.item_loop import ChunkContext, ChunkOutcome, ItemLoop
from genjob.worker.leasing import RENEWER, lease_holder
from genjob.worker.metrics import metered
from genjob.worker.provenance import note_once
from genjob.worker.runners import RUNNERS, JobRunner

log = logging.getLogger(__name__)


class WorkerFault(RuntimeError):
    """This worker failed while holding a chunk's items (not the job's fault): each held item's try
    was counted and its lease ended, for a sweeper to queue it again. ``sticky``: the device is unusable
    in this process (the process must exit)."""

    def __init__(self, message: str, *, sticky: bool = False) -> None:
        super().__init__(message)
        self.sticky = sticky


def measurements(
    stats: EngineStats,
    *,
    busy_seconds: float,
    last_draft_tokens: int | None,
    setup_extra_s: float = 0.0,
    proposer_counts: dict[str, int] | None = None,
) -> store.ChunkMeasurements:
    """A chunk's sums for the job. ``setup_extra_s`` (measuring costs for speculation beyond what plain
    decoding measures) counts as decoding time: plain decoding would not have spent it."""
    return store.ChunkMeasurements(
        busy_seconds=busy_seconds,
        decode_rounds=stats.rounds,
        decode_rows=stats.rows_sum,
        decode_tokens=stats.tokens,
        decode_seconds=stats.seconds + setup_extra_s,
        probe_rounds=stats.probe_rounds,
        probe_tokens=stats.probe_tokens,
        probe_seconds=stats.probe_seconds,
        probe_sq=stats.probe_sq,
        prefill_seconds=stats.prefill_seconds,
        gamma_hist=dict(stats.gamma_hist),
        drafts_hist=dict(stats.drafts_hist),
        last_draft_tokens=last_draft_tokens,
        proposer_counts=dict(proposer_counts or {}),
        rounds_by_rows=dict(stats.by_rows),
    )


def _derive(job: Any, *, runner: JobRunner) -> dict[str, Any] | None:
    """The job's expected speedup, cost ratio and costs at its mean batch size, from its new sums
    (``job``: a ``Job``, or the row ``genjob.store.close_chunk`` returned); None if it has nothing
    to derive."""
    hist = {int(k): n for k, n in (job.gamma_hist or {}).items()}
    if runner.engine.proposer is None or not hist:
        return None
    costs = runner.engine.costs
    if costs is None:
        return None
    drafts = {int(m): n for m, n in (job.drafts_hist or {}).items()}
    batch = job.decode_rows / job.decode_rounds if job.decode_rounds else 1.0
    tried = job.draft_accepted + job.draft_rejections
    alpha = job.draft_accepted / tried if tried else 0.0
    plain = costs.verify_seconds(max(1, round(batch)), 1)
    summary: dict[str, Any] = costs.as_dict()
    summary["at_batch"] = costs.at_batch(batch, sorted(hist))
    return {
        "expected_speedup": expected_speedup(costs, alpha, hist, batch, drafts),
        "cost_ratio": costs.draft_seconds(max(1, round(batch))) / plain,
        "costs": summary,
    }


def _measured(runner: JobRunner, started: float, loop: ItemLoop) -> store.ChunkMeasurements | None:
    engine = getattr(runner, "engine", None)
    if engine is None:
        return None
    return measurements(
        engine.stats.take(),
        busy_seconds=time.perf_counter() - started,
        last_draft_tokens=engine.k if engine.proposer is not None else None,
        setup_extra_s=runner.take_setup_extra() if isinstance(runner, JobRunner) else 0.0,
        proposer_counts=dict(loop.proposer_counts),
    )


def process_chunk(
    *,
    settings: Settings,
    job_id: str,
    worker: str,
    item_ids: list[int] | None = None,
    seq_range: tuple[int, int] | None = None,
) -> ChunkOutcome:
    """Generate every open item of the chunk (a range of the job's items, or a list of item ids);
    stop claiming if the job ends meanwhile, or the worker is asked to stop."""
    chunk = store.ChunkRef(job_id, seq_range, tuple(item_ids) if item_ids is not None else None)
    holder = lease_holder(worker)
    chunks = store.chunk_store(
        settings.database_url,
        job_id=job_id,
        holder=holder,
        lease_s=settings.lease_s,
        max_attempts=settings.max_attempts,
        retry_s=settings.db_retry_s,
    )
    tx = chunks.tx
    outcome = ChunkOutcome()
    opened = chunks.open(chunk)
    if opened is None:
        outcome.skipped, outcome.stopped = len(chunk), True
        return outcome
    spec, mine, queue = opened.spec, opened.reserved, opened.queue
    outcome.skipped = len(chunk) - len(mine)  # final, or held by another live worker
    if not mine:  # the job may have ended with the items another worker finished
        chunks.close(let_go=[])
        return outcome
    started = time.perf_counter()
    # The leases are renewed from here on: loading the models may take longer than a lease, but not
    # longer than GENJOB_LOAD_STALL_S; then each round must end within GENJOB_ROUND_STALL_S.
    with RENEWER.holding(settings, item_ids=mine, holder=holder, allow_s=settings.load_stall_s) as renewal:
        try:
            runner = RUNNERS.get(job_id, spec, settings=settings)
        except ModelLoadError as exc:  # the job's fault: it fails
            log.error("job %s: %s", job_id, exc)
            tx(store.fail_job, job_id=job_id, error=str(exc))
            outcome.stopped = True
            return outcome
        except Exception as exc:  # this worker's fault (out of memory in warm-up, say)
            renewal.stop()  # the leases it ends stay ended
            raise _fault(tx, settings, job_id=job_id, item_ids=mine, holder=holder, exc=exc) from exc
        note_once(tx, job_id=job_id, spec=spec)
        log.info(
            "job %s: decoding %d items from here (models and costs ready in %.1f s)",
            job_id,
            len(mine),
            time.perf_counter() - started,
        )
        renewal.beat()  # loaded: from here on, rounds
        context = ChunkContext(
            settings=settings,
            worker=worker,
            chunks=chunks,
            stop_renewals=renewal.stop,
            beat=renewal.beat,
        )
        labels = {"model": spec.model, "queue": queue, "mode": spec.mode.value, "worker": worker}
        loop = ItemLoop(runner, context, outcome)
        with metered(runner.engine, outcome, **labels):
            try:
                loop.run(mine, keep_last=chunks.keeps_last_group)  # the last group goes with the close
                if isinstance(runner, JobRunner):
                    runner.keep_costs()  # what its rounds learnt, for the processes that follow
                measured = _measured(runner, started, loop)
                renewal.stop()  # none after the close, which may end leases (a graceful stop)
                last, loop.finished = loop.finished, []
                try:
                    done = chunks.close(
                        let_go=[i for i in mine if i not in loop.claimed or i in loop.alone],  # held pending
                        finished=last,
                        measured=measured,
                        derive=functools.partial(_derive, runner=runner),
                        interrupted=outcome.interrupted,
                    )
                except Exception:
                    loop.finished = last  # not written: a fault below writes them or counts their try
                    raise
                loop.written(last, done, set())
            except RETRYABLE_DB_ERRORS:
                raise  # the database is away: the task queues the chunk again later
            except Exception as exc:
                renewal.stop()
                raise _fault(
                    tx, settings, job_id=job_id, item_ids=mine, holder=holder, exc=exc, loop=loop
                ) from exc
    return outcome


def _fault(
    tx: Callable[..., Any],
    settings: Settings,
    *,
    job_id: str,
    item_ids: list[int],
    holder: str,
    exc: Exception,
    loop: ItemLoop | None = None,
) -> WorkerFault:
    """Count a try for every item this worker holds, end its leases (a sweeper queues them again;
    those out of tries fail with this error), and say so in one line."""
    error = f"{type(exc).__name__}: {exc}"
    log.error("job %s: this worker failed holding %d items: %s", job_id, len(item_ids), error, exc_info=exc)
    counted = loop.give_up_in_flight(error) if loop is not None else set()
    tx(
        store.count_a_try_and_let_go,
        item_ids=[item_id for item_id in item_ids if item_id not in counted],
        worker=holder,
        error=error,
        max_attempts=settings.max_attempts,
    )
    tx(store.finalize_job, job_id=job_id)
    return WorkerFault(f"job {job_id}: {error}", sticky=is_sticky_device_error(exc))
