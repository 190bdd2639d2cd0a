"""What a chunk's item loop (``genjob.worker.item_loop``) is given and what it tells back.

``Runner``: a job's runner as the chunk uses it (``genjob.worker.runners.JobRunner``; the tests' stand-in
implements the same members), so that no code looks a member up by name or checks for a double.

``ChunkContext``: the chunk's store (``genjob.store.ChunkStore``: the job, who holds its leases, every
write, whatever the database), and the chunk's renewals: ``stop_renewals`` before leases are handed
back, ``beat`` after each engine round (its leases are renewed only while it beats:
``genjob.worker.leasing``). ``ChunkOutcome``: what became of the chunk's items.
Must not know: HTTP, the CLI, torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from genjob.options import JobSpec
from genjob.settings import Settings
from genjob.store import ChunkStore
from genjob.store.claims import ClaimedItem

if TYPE_CHECKING:
    from genjob.generation.engine import Engine
    from genjob.generation.requests import Finished, Request


class Runner(Protocol):
    """A job's runner in a worker process: its engine, and what turns an item into a request and a
    finished row into text."""

    spec: JobSpec
    engine: Engine
    batch_size: int  # rows per batch on this worker
    setup_extra_s: float  # seconds spent on speculation alone (draft loading, costs), not yet charged

    def request(self, item: ClaimedItem, *, key: int | None = None, plain: bool = False) -> Request: ...

    def is_lossless_sample(self, seq: int) -> bool: ...

    def learn(self, done: Finished) -> None: ...

    def text(self, tokens: list[int]) -> str: ...

    def release(self) -> None: ...

    def take_setup_extra(self) -> float: ...

    def keep_costs(self) -> None: ...


@dataclass
class ChunkOutcome:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    retried: int = 0
    stopped: bool = False
    interrupted: bool = False  # a graceful stop (SIGTERM): what was left is given back

    def counts(self) -> dict[str, int]:
        """The items counted so far, by state (the ``state`` label of ``genjob_items_total``)."""
        return {"done": self.done, "failed": self.failed, "retried": self.retried, "skipped": self.skipped}


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
