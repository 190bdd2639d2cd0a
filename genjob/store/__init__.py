"""The store: every SQL statement on jobs, items, results and attempts, as keyword-only functions
taking a Session (``jobs``: whole jobs; ``items``: one item's transitions; ``leases``: who holds an
item). Must not know: Celery, torch, transformers, the HTTP API or the CLI."""

from genjob.store.items import (
    Refused,
    claim_item,
    fail_item,
    finish_item,
    release_for_retry,
)
from genjob.store.jobs import (
    ChunkMeasurements,
    JobNotFound,
    batched,
    cancel_job,
    create_job,
    expire_due_jobs,
    fail_job,
    finalize_job,
    get_job,
    iter_results,
    list_jobs,
    live_jobs_with_pending_items,
    mark_job_running,
    new_job_id,
    pending_item_chunks,
    record_chunk,
    retry_failed_items,
)

__all__ = [
    "ChunkMeasurements",
    "JobNotFound",
    "Refused",
    "batched",
    "cancel_job",
    "claim_item",
    "create_job",
    "expire_due_jobs",
    "fail_item",
    "fail_job",
    "finalize_job",
    "finish_item",
    "get_job",
    "iter_results",
    "list_jobs",
    "live_jobs_with_pending_items",
    "mark_job_running",
    "new_job_id",
    "pending_item_chunks",
    "record_chunk",
    "release_for_retry",
    "retry_failed_items",
]
