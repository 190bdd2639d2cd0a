"""What a chunk's item loop (``genjob.worker.item_loop``) is given and what it tells back.

``ChunkContext``: the job, who holds its leases, how to write (a transaction, or one statement on
Postgres), and the chunk's renewals: ``stop_renewals`` before leases are handed back, ``beat`` after
each engine round (its leases are renewed only while it beats: ``genjob.worker.leasing``).
``ChunkOutcome``: what became of the chunk's items. Must not know: HTTP, the CLI, torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from genjob.settings import Settings


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
    job_id: str
    holder: str  # the lease holder: worker name / pid
    worker: str
    tx: Callable[..., Any]
    # Postgres: one statement in autocommit (db.run_statement), for the group's write-and-claim
    statement: Callable[..., Any] | None = None
    stop_renewals: Callable[[], None] = lambda: None  # before leases are handed back: none renews them
    # Progress (after each engine round; ``extra_s``: a known wait before the next): leases follow it
    beat: Callable[..., None] = _no_beat
