"""Run one chunk of a job: lease its items, run them through the job's engine, record what it measured.

``ChunkRun`` owns a chunk's whole lifecycle, a method a step (open, load, decode, close, give back),
between the Celery task (which only passes ids and maps how it ended) and the engine (which only sees
token ids); ``WorkerProcess`` (``PROCESS``) is what a process keeps across chunks: its cache of job
runners and its lease renewer. The items go through the one item loop (``genjob.worker.item_loop``);
at the close the engine's measurements of the chunk (rounds, plain probe rounds, prefill, the worker's
busy time, the γ histogram) are added to the job, and the job's expected speedup is derived again
from the sums the close returned and the costs this worker measured.

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

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from genjob import store
from genjob.db import RETRYABLE_DB_ERRORS
from genjob.generation.costs import expected_speedup
from genjob.generation.engine_stats import EngineStats
from genjob.generation.loading import ModelLoadError
from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.worker.chunk_context import ChunkContext, ChunkOutcome, Runner
from genjob.worker.devices import is_sticky_device_error
from genjob.worker.item_loop import ItemLoop
from genjob.worker.leasing import LeaseRenewer, Renewal, lease_holder
from genjob.worker.metrics import metered
from genjob.worker.provenance import note_once
from genjob.worker.runners import JobRunner, RunnerCache

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
    """A chunk's sums for the job. ``setup_extra_s`` (loading the draft model and measuring costs: what
    only speculation spends) counts as decoding time: plain decoding would not have spent it."""
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


def _derive(job: store.ClosedChunk, *, runner: Runner) -> dict[str, Any] | None:
    """The job's expected speedup, cost ratio and costs at its mean batch size, from its sums as the
    chunk's close left them; None if it has nothing to derive."""
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


@dataclass
class WorkerProcess:
    """What a worker process keeps from one chunk to the next: its job runners (models loaded once
    per job) and the one thread that renews its leases. Each process has one (``PROCESS``); a forked
    pool child inherits its parent's and starts its own renewer thread at its first chunk."""

    runners: RunnerCache = field(default_factory=lambda: RunnerCache(JobRunner.build))
    renewer: LeaseRenewer = field(default_factory=LeaseRenewer)


PROCESS = WorkerProcess()


class ChunkRun:
    """One chunk from its message to its close, each step a method, as arq's ``Worker.run_job`` owns a
    job: ``open`` (lease its items), ``load`` (the job's runner), ``decode`` (the item loop), ``close``
    (the last group, what it let go, what it measured), and ``give_back`` when this worker fails
    holding its items. ``run`` is the whole of it; the Celery task only maps its ending to Celery's."""

    def __init__(
        self, settings: Settings, chunk: store.ChunkRef, *, worker: str, process: WorkerProcess = PROCESS
    ) -> None:
        self.settings, self.chunk, self.worker, self.process = settings, chunk, worker, process
        self.holder = lease_holder(worker)
        self.chunks = store.chunk_store(
            settings.database_url,
            job_id=chunk.job_id,
            holder=self.holder,
            lease_s=settings.lease_s,
            max_attempts=settings.max_attempts,
            retry_s=settings.db_retry_s,
        )
        self.outcome = ChunkOutcome()
        self.mine: list[int] = []  # the items leased to this chunk, in order
        self.started = 0.0  # time.perf_counter() once its items were leased: its busy time from then

    @property
    def job_id(self) -> str:
        return self.chunk.job_id

    def run(self) -> ChunkOutcome:
        """Generate every open item of the chunk; stop claiming if the job ends meanwhile, or the
        worker is asked to stop."""
        opened = self.open()
        if opened is None:
            return self.outcome
        settings, self.started = self.settings, time.perf_counter()
        # The leases are renewed from here on: loading the models may take longer than a lease, but not
        # longer than GENJOB_LOAD_STALL_S; then each round must end within GENJOB_ROUND_STALL_S.
        with self.process.renewer.holding(
            settings, item_ids=self.mine, holder=self.holder, allow_s=settings.load_stall_s
        ) as renewal:
            runner = self.load(opened.spec, renewal)
            if runner is None:
                return self.outcome
            renewal.beat()  # loaded: from here on, rounds
            context = ChunkContext(
                settings=settings,
                worker=self.worker,
                chunks=self.chunks,
                stop_renewals=renewal.stop,
                beat=renewal.beat,
            )
            loop = ItemLoop(runner, context, self.outcome)
            labels = {"model": opened.spec.model, "queue": opened.queue, "mode": opened.spec.mode.value}
            with metered(runner.engine, self.outcome, **labels, worker=self.worker):
                try:
                    self.decode(loop)
                    renewal.stop()  # none after the close, which may end leases (a graceful stop)
                    self.close(loop)
                except RETRYABLE_DB_ERRORS:
                    raise  # the database is away: the task queues the chunk again later
                except Exception as exc:
                    renewal.stop()
                    raise self.give_back(exc, loop) from exc
        return self.outcome

    def open(self) -> store.OpenedChunk | None:
        """Lease the chunk's open items; None: nothing to run (the job ended, or every item is final
        or held by another live worker)."""
        opened = self.chunks.open(self.chunk)
        if opened is None:
            self.outcome.skipped, self.outcome.stopped = len(self.chunk), True
            return None
        self.mine = opened.reserved
        self.outcome.skipped = len(self.chunk) - len(self.mine)  # final, or held by another live worker
        if not self.mine:  # the job may have ended with the items another worker finished
            self.chunks.close(let_go=[])
            return None
        return opened

    def load(self, spec: JobSpec, renewal: Renewal) -> Runner | None:
        """The job's runner (built once per job in this process); None: its models cannot load, and
        the job failed."""
        try:
            runner = self.process.runners.get(self.job_id, spec, settings=self.settings)
        except ModelLoadError as exc:  # the job's fault: it fails
            log.error("job %s: %s", self.job_id, exc)
            self.chunks.tx(store.fail_job, job_id=self.job_id, error=str(exc))
            self.outcome.stopped = True
            return None
        except Exception as exc:  # this worker's fault (out of memory in warm-up, say)
            renewal.stop()  # the leases it ends stay ended
            raise self.give_back(exc) from exc
        note_once(self.chunks.tx, job_id=self.job_id, spec=spec)
        log.info(
            "job %s: decoding %d items from here (models and costs ready in %.1f s)",
            self.job_id,
            len(self.mine),
            time.perf_counter() - self.started,
        )
        return runner

    def decode(self, loop: ItemLoop) -> None:
        """Every item through the item loop; the last group is left for the close where the store
        writes it there."""
        loop.run(self.mine, keep_last=self.chunks.keeps_last_group)
        loop.runner.keep_costs()  # what its rounds learnt, for the processes that follow

    def close(self, loop: ItemLoop) -> None:
        """Write the last group, let go of the items the chunk did not run, add what it measured to
        the job and what that changes in its expected speedup."""
        runner = loop.runner
        measured = measurements(
            runner.engine.stats.take(),
            busy_seconds=time.perf_counter() - self.started,
            last_draft_tokens=runner.engine.k if runner.engine.proposer is not None else None,
            setup_extra_s=runner.take_setup_extra(),
            proposer_counts=dict(loop.proposer_counts),
        )
        last, loop.finished = loop.finished, []
        try:
            closed = self.chunks.close(
                let_go=[i for i in self.mine if i not in loop.claimed or i in loop.alone],  # held pending
                finished=last,
                measured=measured,
                interrupted=self.outcome.interrupted,
            )
        except Exception:
            loop.finished = last  # not written: a fault below writes them or counts their try
            raise
        if closed is None:  # no job, or nothing written done
            loop.written(last, set(), set())
            return
        loop.written(last, closed.finished, set())
        derived = _derive(closed, runner=runner)
        if derived is not None:
            self.chunks.record_derived(closed, derived)

    def give_back(self, exc: Exception, loop: ItemLoop | None = None) -> WorkerFault:
        """This worker failed holding the chunk's items: count a try for each (a sweeper queues them
        again; those out of tries fail with this error), end their leases, and say so in one line."""
        job_id, tx = self.job_id, self.chunks.tx
        error = f"{type(exc).__name__}: {exc}"
        log.error(
            "job %s: this worker failed holding %d items: %s", job_id, len(self.mine), error, exc_info=exc
        )
        counted = loop.give_up_in_flight(error) if loop is not None else set()
        tx(
            store.count_a_try_and_let_go,
            item_ids=[item_id for item_id in self.mine if item_id not in counted],
            worker=self.holder,
            error=error,
            max_attempts=self.settings.max_attempts,
        )
        tx(store.finalize_job, job_id=job_id)
        return WorkerFault(f"job {job_id}: {error}", sticky=is_sticky_device_error(exc))


def process_chunk(
    *,
    settings: Settings,
    job_id: str,
    worker: str,
    item_ids: list[int] | None = None,
    seq_range: tuple[int, int] | None = None,
) -> ChunkOutcome:
    """Run the chunk (a range of the job's items, or a list of item ids) in this process: ``ChunkRun``."""
    chunk = store.ChunkRef(job_id, seq_range, tuple(item_ids) if item_ids is not None else None)
    return ChunkRun(settings, chunk, worker=worker).run()
