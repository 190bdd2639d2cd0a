"""The sweeper: a thread in every worker's main process that keeps jobs moving when workers die.

Every ``sweep_interval_s`` it
  1. ends jobs past their deadline (``expired``; their pending items too);
  2. takes back items whose lease ran out (the worker holding them was killed, lost power, froze,
     stopped, or failed holding them) and queues them again; those that used every try fail; without
     this a SIGKILLed worker's chunk would wait for the broker's visibility timeout (hours);
  3. finishes the queueing of jobs whose publisher stopped half-way (a submit killed mid-enqueue,
     a broker that was down): ``jobs.queued_seq`` says how far it got;
  4. ends live jobs whose items are all final (their last worker died before it could);
  5. notices a broker that lost its queues (Redis restarted without persistence, or flushed):
     the marker key it keeps there is gone, so it queues the pending items of every live job
     again (``genjob.queueing.recover_lost_queues``, which ``genjob requeue`` also calls: whichever
     notices first queues them, once). On a broker that never had the marker (a fresh one) there
     is nothing to queue again, and nothing is said.
Sweepers on many workers may run at once: reclaiming locks the rows it takes (SKIP LOCKED) and
the marker is set with SET NX, so each lost item is queued again by one sweeper (or one requeue).

The main process forks the pool's children (again, whenever one dies), and a child forked in
the middle of a sweep would inherit the locks the sweep thread held (an import, a connection
pool) and hang on them. So a sweep holds ``SWEEP_LOCK`` throughout and every fork waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from celery import Celery, bootsteps
from sqlalchemy import select

from genjob import store
from genjob.db import run_transaction
from genjob.queueing import (  # noqa: F401  # re-exported: the marker's key and lifetime
    BROKER_MARK_TTL_S,
    broker_mark_key,
    publish_ranges,
    publish_rest,
    recover_lost_queues,
)
from genjob.store import leases
from genjob.tables import Job
from genjob.worker.leasing import worker_name
from genjob.worker.metrics import note_swept_items

log = logging.getLogger(__name__)

SWEEP_LOCK = threading.Lock()
os.register_at_fork(
    before=SWEEP_LOCK.acquire, after_in_parent=SWEEP_LOCK.release, after_in_child=SWEEP_LOCK.release
)


@dataclass
class SweepReport:
    expired_jobs: int = 0
    reclaimed_items: int = 0
    recovered_chunks: int = 0
    finished_queueing: int = 0
    ended_jobs: int = 0


def reclaimed_words(count: int, handed_back: int) -> str:
    """``3 items lost with their worker (their leases ran out) and 2 handed back by a stopping or
    failing worker``: what a sweep queues again, by why."""
    lost = count - handed_back
    parts = []
    if lost:
        parts.append(f"{lost} item{'s' * (lost != 1)} lost with their worker (leases ran out unrenewed)")
    if handed_back:
        noun = "item" if handed_back == 1 else "items"
        parts.append(f"{handed_back} {noun} handed back by a stopping or failing worker")
    return " and ".join(parts)


class Sweeper:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self.settings = app.genjob_settings

    def sweep(self) -> SweepReport:
        report = SweepReport()
        url = self.settings.database_url
        expired = run_transaction(url, store.expire_due_jobs)
        report.expired_jobs = len(expired)
        if expired:
            log.warning("jobs past their deadline, now expired: %s", ", ".join(expired))
        report.reclaimed_items = run_transaction(url, self._requeue_expired_leases)
        report.finished_queueing = self._finish_stalled_queueing()
        ended = run_transaction(url, store.finalize_settled_jobs)
        report.ended_jobs = len(ended)
        if ended:
            log.warning("jobs whose items had all ended, now ended too: %s", ", ".join(ended))
        report.recovered_chunks = self._recover_lost_queues()
        return report

    def _requeue_expired_leases(self, session) -> int:
        """Queue again, before the reset commits, the items whose workers died (or failed holding them);
        count them (retried) and those out of tries (failed) in this worker's metrics, by model."""
        gave_up: dict[str, int] = {}
        handed_back: dict[str, int] = {}
        reclaimed = leases.reclaim_expired_leases(
            session, max_attempts=self.settings.max_attempts, gave_up_counts=gave_up, handed_back=handed_back
        )
        if reclaimed or gave_up:  # counted first: between the publishing and the commit, nothing else
            jobs = {
                job_id: (model, queue, str(mode))
                for job_id, model, queue, mode in session.execute(
                    select(Job.id, Job.model, Job.queue, Job.mode).where(Job.id.in_([*reclaimed, *gave_up]))
                )
            }
            retried = {job_id: len(seqs) for job_id, (_, seqs) in reclaimed.items()}
            note_swept_items(jobs, worker=worker_name(), retried=retried, failed=gave_up)
        # Published last, just before the commit: until it commits, these rows stay locked, and a claim
        # skips locked rows (SKIP LOCKED), so a worker quick to take the message would skip the item.
        for job_id, (queue, seqs) in reclaimed.items():
            words = reclaimed_words(len(seqs), handed_back.get(job_id, 0))
            log.warning("job %s: %s, queued again", job_id, words)
            ranges = store.seq_runs(seqs, self.settings.chunk_size)
            publish_ranges(self.app, job_id=job_id, queue=queue, ranges=ranges)
        return sum(len(seqs) for _, seqs in reclaimed.values())

    def _finish_stalled_queueing(self) -> int:
        """Queue the rest of every job whose publisher stopped (its progress is older than a lease)."""
        url, sent = self.settings.database_url, 0
        stalled = run_transaction(url, store.take_over_stalled_queueing, stalled_for_s=self.settings.lease_s)
        for job_id, queue, queued_seq, total in stalled:
            log.warning(
                "job %s: its submit stopped queueing at item %d of %d; queueing the rest",
                job_id,
                queued_seq,
                total,
            )
            sent += publish_rest(
                self.app,
                database_url=url,
                job_id=job_id,
                queue=queue,
                start=queued_seq,
                stop=total,
                chunk_size=self.settings.chunk_size,
            )
        return sent

    def _recover_lost_queues(self) -> int:
        """Queue every live job's pending items again where the broker lost its queues (its marker is
        gone): once, whether this sweeper or a ``genjob requeue`` notices first (``recover_lost_queues``)."""
        recovered = recover_lost_queues(self.settings, self.app, max_attempts=self.settings.max_attempts)
        return sum(recovered.values()) if recovered else 0


class SweeperStep(bootsteps.StartStopStep):
    """Runs a ``Sweeper`` in a daemon thread of the worker's main process (a Celery bootstep)."""

    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, worker) -> None:
        sweeper = Sweeper(worker.app)
        interval = sweeper.settings.sweep_interval_s
        self._thread = threading.Thread(target=self._run, args=(sweeper, interval), name="genjob-sweeper")
        self._thread.daemon = True
        self._thread.start()

    def _run(self, sweeper: Sweeper, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                with SWEEP_LOCK:
                    sweeper.sweep()
            except Exception as exc:
                log.warning("sweep failed (next in %g s): %s", interval, exc)

    def stop(self, worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    shutdown = stop
