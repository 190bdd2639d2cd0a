"""Celery tasks. A message names a job and a range of its items, never prompts: the database has them.

``generate_chunk(job_id, start, stop)`` runs the job's items with ``seq`` in [start, stop); a message
of the old format, ``generate_chunk(job_id, [item ids])`` (still queued during an upgrade), runs those
items. In Flower a chunk reads ``job=abc123 items 100-163`` (its ``argsrepr``), and its result says
``chunk: clean`` or ``stopped`` (the job ended, or the worker was stopped), with its counts. A chunk
with items that failed for good, or whose worker failed holding it (``WORKER FAULT``), ends in
``ChunkNotClean`` once all is recorded: Flower lists it as FAILURE (its Failed filter, the worker's
Failed count), the kind and counts in the exception's text. That changes nothing in how the message is
delivered: a task that raises is acknowledged like one that returns (acks late, acks on failure),
never retried (no autoretry; the exception is expected, logged without a traceback), so the chunk is
not run again. A fault that is a sticky device error (``genjob.worker.devices``) is different: its items
given back, the pool process exits (``DeviceLost``, a SystemExit), Celery starts a fresh one on the same
device, and the chunk's message, a lost worker's, goes back to the queue (acks late) for it.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.signals import worker_process_init

from genjob.constants import TASK_GENERATE_CHUNK
from genjob.db import RETRYABLE_DB_ERRORS
from genjob.store import ChunkRef

if TYPE_CHECKING:
    from genjob.worker.chunk_context import ChunkOutcome

log = logging.getLogger(__name__)

MAX_TASK_RETRY_DELAY_S = 60


class DeviceLost(SystemExit):
    """This pool process's device is unusable until the process ends: it exits (``EXIT_DEVICE_LOST``)."""


EXIT_DEVICE_LOST = 70  # EX_SOFTWARE


class ChunkNotClean(Exception):
    """A chunk with items that failed for good, or whose worker failed holding it; raised after its
    outcome is recorded, so that Celery reports the task as failed (see the module's doc)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result)
        self.result = result


def chunk_result(outcome: ChunkOutcome) -> dict[str, Any]:
    """The task's result, as Flower shows it: the chunk's kind first, then its counts."""
    kind = "stopped" if outcome.stopped else "WITH FAILURES" if outcome.failed else "clean"
    return {"chunk": kind, "done": outcome.done, "failed": outcome.failed, "skipped": outcome.skipped}


def chunk_of_message(job_id: str, items: int | list[int], stop: int | None) -> ChunkRef:
    """The chunk a message names: ``(job id, start, stop)``, or the old format's ``(job id, [item ids])``."""
    if isinstance(items, list):
        return ChunkRef(job_id, item_ids=tuple(int(item_id) for item_id in items))
    return ChunkRef(job_id, seq_range=(int(items), int(stop if stop is not None else items + 1)))


def register_tasks(app: Celery) -> None:
    settings = app.genjob_settings
    from genjob.worker.stop_deadline import install_stop_deadline
    from genjob.worker.stopping import install_stop_handlers

    install_stop_handlers()
    install_stop_deadline()  # a warm shutdown ends by GENJOB_STOP_GRACE_S + a margin, stuck pool or not

    @worker_process_init.connect(weak=False)
    def _watch_progress(**_kwargs) -> None:
        from genjob.worker.chunks import PROCESS

        PROCESS.renewer.end_when_stalled = True  # a pool process that stalls is killed: Celery replaces it

    @worker_process_init.connect(weak=False)
    def _take_device(**_kwargs) -> None:
        from genjob.worker.devices import take_pool_device

        take_pool_device(app)  # cuda:i for the i-th process, in its own copy of the settings

    @worker_process_init.connect(weak=False)
    def _set_threads(**_kwargs) -> None:
        import torch

        from genjob.worker.main import pool_threads

        torch.set_num_threads(pool_threads(settings, app.conf.worker_concurrency or 1))

    # shared=False: a task of one app (its settings) must never be lent to another app.
    # throws: ChunkNotClean is how a chunk with failures ends, not a crash (INFO, no traceback).
    @app.task(name=TASK_GENERATE_CHUNK, bind=True, shared=False, throws=(ChunkNotClean,))
    def generate_chunk(self: Task, job_id: str, items: int | list[int], stop: int | None = None) -> dict:
        """Generate the items [``items``, ``stop``) of job ``job_id`` (or the item ids ``items``):
        ``ChunkRun`` does it all; this maps how it ends to Celery's (a retry, a failure, an exit)."""
        from genjob.worker.chunks import ChunkRun, WorkerFault  # torch loads in the worker only
        from genjob.worker.leasing import worker_name
        from genjob.worker.stopping import catch_sigterm_in_pool

        worker = self.request.hostname or worker_name()
        if not self.request.is_eager:
            catch_sigterm_in_pool()
        chunk = chunk_of_message(job_id, items, stop)
        try:
            outcome = ChunkRun(self.app.genjob_settings, chunk, worker=worker).run()
        except RETRYABLE_DB_ERRORS as exc:
            # The database stayed away longer than db_retry_s. Acking would lose the chunk's
            # unreserved items, so queue the chunk again, later (backoff, no limit).
            if self.request.is_eager:
                raise
            delay = min(5 * 2**self.request.retries, MAX_TASK_RETRY_DELAY_S)
            log.error("job %s: database unavailable (%s); chunk queued again in %d s", job_id, exc, delay)
            raise self.retry(exc=exc, countdown=delay, max_retries=None) from exc
        except WorkerFault as fault:
            if self.request.is_eager:
                raise
            if fault.sticky:  # its items are back: this process goes, a fresh one takes its place
                log.error("job %s: the device is unusable in this process; it exits: %s", job_id, fault)
                # billiard answers a child's exit with a SIGTERM to it: that must not raise the stop
                # flag that this process shares with the worker's others (``catch_sigterm_in_pool``)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                raise DeviceLost(EXIT_DEVICE_LOST) from fault
            raise ChunkNotClean({"chunk": "WORKER FAULT", "done": 0, "failed": 0, "skipped": 0}) from None
        log.info("job %s chunk %s: %s", job_id, chunk, outcome)
        result = chunk_result(outcome)
        if outcome.failed and not self.request.is_eager:  # embedded: the caller reads the result
            raise ChunkNotClean(result)
        return result
