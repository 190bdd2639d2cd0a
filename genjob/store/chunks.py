"""One chunk's bookkeeping, whatever the database: ``chunk_store`` picks the backend from the URL.

A worker opens a chunk (leases its items), writes each group of finished items with the claim of the
next (``write_and_claim``), and closes it (its last group, the items it let go, what it measured);
``ChunkStore`` does each in a transaction (every backend; SQLite's, the embedded mode's), and
``PostgresChunkStore`` in one autocommit statement each (``postgres_chunk_ends``,
``postgres_groups``): one round trip per group, no BEGIN or COMMIT, the last group written with the
close. The caller never looks at the URL; it asks ``keeps_last_group`` whether the close writes the
last group. The close hands back the job's sums as it left them (``ClosedChunk``); what the worker
derives from them (its expected speedup, say) it writes with ``record_derived``, unless a later chunk's
sums came meanwhile. Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES, JobStatus
from genjob.db import run_statement, run_transaction
from genjob.options import JobSpec
from genjob.store import leases
from genjob.store.claims import ClaimedItem, Refused
from genjob.store.items import write_and_claim
from genjob.store.jobs import ChunkMeasurements, expire_due_jobs, finalize_job, mark_job_running, record_chunk
from genjob.store.postgres_chunk_ends import JOB_COLUMNS, ClosedChunk, close_chunk, open_chunk, record_derived
from genjob.store.postgres_groups import finish_and_claim
from genjob.tables import Job

Rows = list[tuple[ClaimedItem, dict[str, Any]]]  # finished items and their result rows
Claimed = list[ClaimedItem] | Refused


@dataclass(frozen=True)
class ChunkRef:
    """What a task message names: a job and a range of its items (``seq`` in [start, stop)), or, in
    a message of the old format, a list of item ids."""

    job_id: str
    seq_range: tuple[int, int] | None = None
    item_ids: tuple[int, ...] | None = None

    def __len__(self) -> int:
        if self.seq_range is not None:
            return max(0, self.seq_range[1] - self.seq_range[0])
        return len(self.item_ids or ())


@dataclass(frozen=True)
class OpenedChunk:
    """An open chunk: its job's spec and queue, and its items now leased to the worker, in order."""

    spec: JobSpec
    queue: str
    reserved: list[int]


def _job_ended(session: Session, *, job_id: str) -> bool:
    """The job ended (cancelled, say), or is past its deadline: then it expires now."""
    expire_due_jobs(session, job_id=job_id)
    return session.scalar(select(Job.status).where(Job.id == job_id)) in TERMINAL_JOB_STATUSES


def _open_chunk(
    session: Session, *, chunk: ChunkRef, holder: str, lease_s: float, max_attempts: int
) -> OpenedChunk | None:
    job_id = chunk.job_id
    job = session.execute(
        select(Job.status, Job.expires_at, Job.spec, Job.queue).where(Job.id == job_id)
    ).one_or_none()
    if job is None or job.status in TERMINAL_JOB_STATUSES:
        return None
    if job.expires_at is not None and expire_due_jobs(session, job_id=job_id):
        return None
    if job.status != JobStatus.RUNNING:
        mark_job_running(session, job_id=job_id)
    reserved = leases.reserve_items(
        session,
        job_id=job_id,
        worker=holder,
        lease_s=lease_s,
        seq_range=chunk.seq_range,
        item_ids=chunk.item_ids,
        max_attempts=max_attempts,
    )
    return OpenedChunk(JobSpec.model_validate(job.spec), job.queue, reserved)


def _close_chunk(
    session: Session,
    *,
    job_id: str,
    let_go: list[int],
    holder: str,
    measured: ChunkMeasurements | None,
    interrupted: bool,
) -> ClosedChunk | None:
    if let_go and interrupted:  # a graceful stop: the leases end now, for a sweeper to queue them again
        leases.end_leases(session, item_ids=let_go, worker=holder)
    elif let_go:  # the chunk stopped early (its job ended): nobody will run them
        leases.release_reservations(session, item_ids=let_go, worker=holder)
    job = record_chunk(session, job_id=job_id, measured=measured) if measured is not None else None
    closed = None
    if job is not None:  # the job's sums as this chunk left them
        closed = ClosedChunk(finished=set(), **{name: getattr(job, name) for name in JOB_COLUMNS})
    finalize_job(session, job_id=job_id)
    return closed


class ChunkStore:
    """A chunk of ``job_id`` held by ``holder``: every write a transaction (retried for ``retry_s``
    on a dropped connection, like every write of the store)."""

    keeps_last_group = False  # the close writes no finished items: write them before it

    def __init__(
        self, url: str, *, job_id: str, holder: str, lease_s: float, max_attempts: int, retry_s: float
    ):
        self.url, self.job_id, self.holder = url, job_id, holder
        self.lease_s, self.max_attempts, self.retry_s = lease_s, max_attempts, retry_s
        # ``tx(fn, **kwargs)``: any other store function ``fn(session, **kwargs)`` in one transaction
        self.tx = functools.partial(run_transaction, url, retry_s=retry_s, ping=False)

    def _scope(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "holder": self.holder,
            "lease_s": self.lease_s,
            "max_attempts": self.max_attempts,
        }

    def open(self, chunk: ChunkRef) -> OpenedChunk | None:
        """Lease the chunk's open items; None if the job ended (or is due: it ends now)."""
        return self.tx(
            _open_chunk, chunk=chunk, holder=self.holder, lease_s=self.lease_s, max_attempts=self.max_attempts
        )

    def job_ended(self) -> bool:
        """Whether the job ended (cancelled, failed, or expired: a job past its deadline expires now)."""
        return self.tx(_job_ended, job_id=self.job_id)

    def write_and_claim(
        self, *, finished: Rows, failed: list[tuple[ClaimedItem, str]], claim: list[int]
    ) -> tuple[set[int], set[int], Claimed]:
        """Write the rows that finished or failed, claim ``claim``: (ids done, ids failed, the claim)."""
        return self.tx(write_and_claim, finished=finished, failed=failed, claim=claim, **self._scope())

    def close(
        self,
        *,
        let_go: list[int],
        finished: Rows | None = None,
        measured: ChunkMeasurements | None = None,
        interrupted: bool = False,
    ) -> ClosedChunk | None:
        """Write the last ``finished`` items (``keeps_last_group`` only), let go of those it did not run
        (their leases ended now if ``interrupted``), add ``measured`` to the job, end the job if it is
        over. Returns the ids written done and the job's new sums; None: no job, or (here) nothing
        measured, so nothing written done and nothing to derive."""
        assert not finished, "write the last group before the close (keeps_last_group is False)"
        closed: ClosedChunk | None = self.tx(
            _close_chunk,
            job_id=self.job_id,
            let_go=let_go,
            holder=self.holder,
            measured=measured,
            interrupted=interrupted,
        )
        return closed

    def record_derived(self, closed: ClosedChunk, values: dict[str, Any]) -> None:
        """Write ``values`` derived from the job's sums as ``closed`` left them, unless another chunk
        was recorded since (it derives from the newer sums)."""
        self.tx(record_derived, job_id=self.job_id, seen=closed, values=values)


class PostgresChunkStore(ChunkStore):
    """The same on Postgres: the open, each group's write-and-claim and the close one statement each."""

    keeps_last_group = True

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(url, **kwargs)
        self.statement = functools.partial(run_statement, url, retry_s=self.retry_s)

    def open(self, chunk: ChunkRef) -> OpenedChunk | None:
        opened = self.statement(
            open_chunk,
            job_id=chunk.job_id,
            holder=self.holder,
            lease_s=self.lease_s,
            max_attempts=self.max_attempts,
            seq_range=chunk.seq_range,
            item_ids=chunk.item_ids,
        )
        if opened is None or opened.status in TERMINAL_JOB_STATUSES:
            return None
        if opened.due:  # past its deadline: it ends now (nothing was leased)
            self.tx(expire_due_jobs, job_id=chunk.job_id)
            return None
        return OpenedChunk(JobSpec.model_validate(opened.spec), opened.queue, opened.reserved)

    def write_and_claim(
        self, *, finished: Rows, failed: list[tuple[ClaimedItem, str]], claim: list[int]
    ) -> tuple[set[int], set[int], Claimed]:
        if failed:  # rare: the transaction form
            return super().write_and_claim(finished=finished, failed=failed, claim=claim)
        result = self.statement(finish_and_claim, finished=finished, claim=claim, **self._scope())
        if claim and not result.claimed and result.job_ended:
            if result.due:  # past its deadline: expire it now, as a claim in a transaction would
                self.tx(expire_due_jobs, job_id=self.job_id)
            return result.done, set(), Refused.JOB_ENDED
        claimed = [ClaimedItem(job_id=self.job_id, started_at=result.now, **row) for row in result.claimed]
        return result.done, set(), claimed

    def close(
        self,
        *,
        let_go: list[int],
        finished: Rows | None = None,
        measured: ChunkMeasurements | None = None,
        interrupted: bool = False,
    ) -> ClosedChunk | None:
        """One statement (``close_chunk``), and ``finalize_job`` only when the job's counters add up."""
        closed = self.statement(
            close_chunk,
            job_id=self.job_id,
            holder=self.holder,
            finished=finished or [],
            let_go=let_go,
            interrupted=interrupted,
            measured=measured,
        )
        if closed is not None and closed.may_have_ended:
            self.tx(finalize_job, job_id=self.job_id)
        return closed

    def record_derived(self, closed: ClosedChunk, values: dict[str, Any]) -> None:
        self.statement(record_derived, job_id=self.job_id, seen=closed, values=values)


def chunk_store(
    url: str, *, job_id: str, holder: str, lease_s: float, max_attempts: int, retry_s: float
) -> ChunkStore:
    """The chunk's store on the database at ``url``: one statement a step on Postgres, else transactions."""
    backend = PostgresChunkStore if make_url(url).get_backend_name() == "postgresql" else ChunkStore
    return backend(
        url, job_id=job_id, holder=holder, lease_s=lease_s, max_attempts=max_attempts, retry_s=retry_s
    )
