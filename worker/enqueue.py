"""Run a stored job: queue its chunks on the broker, or, embedded (no broker), run them in this process.

The one place that decides between the two, for the CLI and the API. Imports no torch until an
embedded job actually runs. Must not know: HTTP, the CLI.
"""

from __future__ import annotations

from genjob import store
from genjob.db import session_scope
from genjob.queueing import publish_pending
from genjob.settings import Settings
from genjob.store import leases


def enqueue_job(settings: Settings, *, job_id: str, chunk_size: int, everything: bool = False) -> int:
    """Queue what the job is missing as chunks (``everything``: all its pending items not held by a
    live worker), or run them right here in embedded mode. Returns chunks (0: nothing was missing).

    Safe to repeat: workers skip items that are final or held by another live worker.
    """
    if not settings.embedded:
        return publish_pending(
            settings,
            job_id=job_id,
            chunk_size=chunk_size,
            max_attempts=settings.max_attempts,
            everything=everything,
        )
    from genjob.worker.chunks import process_chunk
    from genjob.worker.leasing import worker_name
    from genjob.worker.runners import set_torch_threads

    set_torch_threads(settings)

    with session_scope(settings.database_url) as session:
        leases.reclaim_expired_leases(session, job_id=job_id, max_attempts=settings.max_attempts)
        ranges = list(store.pending_ranges(session, job_id=job_id, chunk_size=chunk_size))
        store.record_queued(session, job_id=job_id, queued_seq=store.get_job(session, job_id=job_id).total)
    for seq_range in ranges:
        process_chunk(settings=settings, job_id=job_id, seq_range=seq_range, worker=worker_name())
    with session_scope(settings.database_url) as session:
        store.finalize_job(session, job_id=job_id)
    return len(ranges)
