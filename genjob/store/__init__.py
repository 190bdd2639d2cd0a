"""The store: every SQL statement on jobs, items, results and attempts, as keyword-only functions
taking a Session (``jobs``: whole jobs; ``items``: item transitions, set-based; ``leases``: who
holds an item; ``queued``: what a job has queued; ``openai_batches``: the Batches API's reads), and
a worker's chunk bookkeeping with its backends inside (``chunks``: transactions everywhere,
``postgres_groups`` and ``postgres_chunk_ends`` its one-statement forms on Postgres).

The names below are imported from their module on first use (PEP 562), so a command that reads one
job (``genjob status``) loads ``jobs`` alone, not the chunk stores, their Postgres statements or
psycopg; ``from genjob.store import X`` and ``store.X`` work as if they were imported here, and so
does ``store.MODULE`` for any module of the package.
Must not know: Celery, torch, transformers, the HTTP API or the CLI."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy sees; at run time ``__getattr__`` imports each on first use
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

# The module (under genjob.store) of each name above, which ``__getattr__`` imports on first use.
_HOMES = {
    "chunks": "ChunkRef ChunkStore OpenedChunk chunk_store",
    "claims": "ClaimedItem Refused",
    "items": "claim_items count_a_try_and_let_go fail_items finish_items give_up_exhausted release_items "
    "stop_items write_and_claim",
    "jobs": "ChunkMeasurements JobNotFound cancel_job create_job expire_due_jobs fail_job finalize_job "
    "finalize_settled_jobs get_job iter_results list_jobs mark_job_running new_job_id record_chunk "
    "retry_failed_items",
    "postgres_chunk_ends": "ClosedChunk close_chunk open_chunk record_derived",
    "postgres_groups": "finish_and_claim",
    "queued": "live_jobs_with_pending_items pending_item_chunks pending_ranges record_queued seq_ranges "
    "seq_runs take_over_stalled_queueing",
}
_HOME = {name: module for module, names in _HOMES.items() for name in names.split()}

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


if not TYPE_CHECKING:  # hidden from mypy, which would otherwise take any ``store.X`` for Any

    def __getattr__(name: str) -> Any:
        """A re-exported name, or a module of the package, imported now (and kept: asked once)."""
        home = _HOME.get(name)
        if home is None:
            if name.startswith("__"):
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            try:
                return importlib.import_module(f"{__name__}.{name}")  # sets it on the package too
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOME})
