"""The store: every SQL statement on jobs, items, results and attempts, as keyword-only functions
taking a Session (``jobs``: whole jobs; ``items``: item transitions, set-based; ``leases``: who
holds an item; ``queued``: what a job has queued; ``openai_batches``: the Batches API's reads), and
a worker's chunk bookkeeping with its backends inside (``chunks``: transactions everywhere,
``postgres_groups`` and ``postgres_chunk_ends`` its one-statement forms on Postgres).
Must not know: Celery, torch, transformers, the HTTP API or the CLI."""

from genjob.store.chunks import ChunkRef, ChunkStore, OpenedChunk, chunk_store
from genjob.store.claims import ClaimedItem, Refused
from genjob.store.items import (
    claim_items,
    count_a_try_and_let_go,
    fail_items,
    finish_items,
    give_up_exhausted,
    release_items,
    stop_items,
    write_and_claim,
)
from genjob.store.jobs import (
    ChunkMeasurements,
    JobNotFound,
    cancel_job,
    create_job,
    expire_due_jobs,
    fail_job,
    finalize_job,
    finalize_settled_jobs,
    get_job,
    iter_results,
    list_jobs,
    mark_job_running,
    new_job_id,
    record_chunk,
    retry_failed_items,
)
from genjob.store.postgres_chunk_ends import ClosedChunk, close_chunk, open_chunk, record_derived
from genjob.store.postgres_groups import finish_and_claim
from genjob.store.queued import (
    live_jobs_with_pending_items,
    pending_item_chunks,
    pending_ranges,
    record_queued,
    seq_ranges,
    seq_runs,
    take_over_stalled_queueing,
)

__all__ = [
    "ChunkMeasurements",
    "ChunkRef",
    "ChunkStore",
    "ClaimedItem",
    "ClosedChunk",
    "JobNotFound",
    "OpenedChunk",
    "Refused",
    "cancel_job",
    "chunk_store",
    "claim_items",
    "close_chunk",
    "count_a_try_and_let_go",
    "create_job",
    "expire_due_jobs",
    "fail_items",
    "fail_job",
    "finalize_job",
    "finalize_settled_jobs",
    "finish_and_claim",
    "finish_items",
    "get_job",
    "give_up_exhausted",
    "iter_results",
    "list_jobs",
    "live_jobs_with_pending_items",
    "mark_job_running",
    "new_job_id",
    "open_chunk",
    "pending_item_chunks",
    "pending_ranges",
    "record_chunk",
    "record_derived",
    "record_queued",
    "release_items",
    "retry_failed_items",
    "seq_ranges",
    "seq_runs",
    "stop_items",
    "take_over_stalled_queueing",
    "write_and_claim",
]
