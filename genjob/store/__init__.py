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

# The block under ``if TYPE_CHECKING:`` is the one list of the package's names: imported there they
# are its exports (for mypy and ruff, these two lines), and ``_homes`` reads it for ``__getattr__``.
# mypy: implicit-reexport
# ruff: noqa: F401

from __future__ import annotations

import ast
import importlib
from pathlib import Path
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


def _homes() -> dict[str, str]:
    """The module (under genjob.store) of each name the ``if TYPE_CHECKING:`` block above imports, read
    from this file: that block is the one list of the package's names, for mypy and for ``__getattr__``."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.name: node.module.rpartition(".")[2]
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_HOME = _homes()
__all__ = sorted(_HOME)


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
