"""What a chunk's item loop (``genjob.worker.item_loop``) is given and what it tells back.

``ChunkContext``: the chunk's store (``genjob.store.ChunkStore``: the job, who holds its leases, every
write, whatever the database), and the chunk's renewals: ``stop_renewals`` before leases are handed
back, ``beat`` after each engine round (its leases are renewed only while it beats:
``genjob.worker.leasing``). ``ChunkOutcome``: what became of the chunk's items.
Must not know: HTTP, the CLI, torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from genjob.settings import Settings
from genjob.store import ChunkStore


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stopped: bool = False
    interrupted: bool = False  # a graceful stop (SIGTERM): what was left is given back


def _no_beat(extra_s: float = 0.0) -> None:
    return None


@dataclass(frozen=True)
class ChunkContext:
    settings: Settings
    worker: str
    chunks: ChunkStore
    stop_renewals: Callable[[], None] = lambda: None  # before leases are handed back: none renews them
    # Progress (after each engine round; ``extra_s``: a known wait before the next): leases follow it
    beat: Callable[..., None] = _no_beat

    @property
    def job_id(self) -> str:
        return self.chunks.job_id

    @property
    def holder(self) -> str:  # the lease holder: worker name / pid
        return self.chunks.holder

    @property
    def tx(self) -> Callable[..., Any]:
        """``tx(fn, **kwargs)``: a store function ``fn(session, **kwargs)`` in one transaction."""
        return self.chunks.tx
