"""Postgres only: a chunk opened and closed in one statement each (data-modifying CTEs, run in autocommit).

Opening (``open_chunk``) reads the job, marks it running if it was queued and leases the chunk's
pending items to the worker (failing those that used every try), as ``leases.reserve_items`` and
``jobs.mark_job_running`` do in a transaction; closing (``close_chunk``) writes the chunk's last
finished items (as ``postgres_groups`` does), gives back the items the chunk did not run and adds the
engine's measurements to the job, as ``leases.release_reservations`` / ``end_leases`` and
``jobs.record_chunk`` do, and says whether the job may have ended (its counters add up), the one
case where the caller asks ``jobs.finalize_job``. One round trip each, no BEGIN or COMMIT; the job's
row is locked only while the server runs the statement: by the open before the items (in the order a
cancel or an expiry takes them), by the close only when it changes the row.
Items are reached by primary key or ``(job_id, seq)``, never by ``(job_id, status)``
(``leases.unindexed_eq``). SQLite (embedded mode) keeps the transaction path.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, CursorResult, bindparam, text, update
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.store.jobs import HISTOGRAMS, SUMS, ChunkMeasurements
from genjob.store.leases import gave_up_error, ids_in_range, lease_is_free
from genjob.store.postgres_groups import COUNTED, ENDED, FINISHED_CTES, finished_params
from genjob.tables import Item, Job, utcnow

# The leases' own conditions (``leases``), rendered once into this statement's text.
_FREE = f"({lease_is_free(bindparam('now'), worker=bindparam('holder'))})"
_GAVE_UP_ERROR = str(gave_up_error(Item.attempts, Item.error).compile(compile_kwargs={"literal_binds": True}))
# The chunk's items: a range of seq read in (job_id, seq) order (only uq_items_job_id_seq gives it),
# or the ids of an old-format message (checked to be the job's).
_BY_RANGE = f"items.id IN ({ids_in_range(*map(bindparam, ('job_id', 'start', 'stop', 'size')))})"
_BY_IDS = "items.id = ANY(CAST(:ids AS bigint[])) AND items.job_id IS NOT DISTINCT FROM :job_id"
_OPEN = """
WITH job AS (  -- locked first, as a cancel or expiry locks it before the job's items: no deadlock
    SELECT status, expires_at, spec, queue FROM jobs WHERE id = :job_id FOR NO KEY UPDATE
), live AS (
    SELECT FROM job WHERE job.status NOT IN ({ended}) AND (job.expires_at IS NULL OR job.expires_at > :now)
), reserved AS (
    UPDATE items SET claimed_by = :holder, lease_expires_at = :lease_until
    WHERE {scope} AND EXISTS (SELECT FROM live) AND items.status IS NOT DISTINCT FROM 'pending'
      AND {free} AND items.attempts < :max_attempts
    RETURNING items.id, items.seq
), gave_up AS (  -- each try killed its worker, say: they fail now, counted in the job's failed
    UPDATE items SET status = 'failed', claimed_by = :holder, finished_at = :now, lease_expires_at = NULL,
        error = {gave_up_error}
    WHERE {scope} AND EXISTS (SELECT FROM live) AND items.status IS NOT DISTINCT FROM 'pending'
      AND {free} AND items.attempts >= :max_attempts
    RETURNING items.id
), started AS (  -- the job's row changes only at its first chunk, or one whose items gave up
    UPDATE jobs SET failed = jobs.failed + (SELECT count(*) FROM gave_up),
        status = CASE WHEN jobs.status = 'queued' THEN 'running' ELSE jobs.status END,
        started_at = CASE WHEN jobs.status = 'queued' THEN :now ELSE jobs.started_at END
    WHERE jobs.id = :job_id AND EXISTS (SELECT FROM live)
      AND (jobs.status = 'queued' OR EXISTS (SELECT FROM gave_up))
)
SELECT job.status, coalesce(job.expires_at <= :now, false) AS due, job.spec, job.queue,
       (SELECT coalesce(json_agg(id ORDER BY seq), '[]') FROM reserved) AS reserved
FROM job
"""
OPEN_BY_RANGE = text(_OPEN.format(ended=ENDED, scope=_BY_RANGE, free=_FREE, gave_up_error=_GAVE_UP_ERROR))
OPEN_BY_IDS = text(_OPEN.format(ended=ENDED, scope=_BY_IDS, free=_FREE, gave_up_error=_GAVE_UP_ERROR))


@dataclass(frozen=True)
class OpenedOnPostgres:
    """The job (its status before the statement; ``due``: past its deadline, not yet expired), its spec
    and queue, and the chunk's items now leased to the worker, in ``seq`` order (none if it ended)."""

    status: str
    due: bool
    spec: dict[str, Any]
    queue: str
    reserved: list[int]

    @property
    def job_ended(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES or self.due


def open_chunk(
    connection: Connection,
    *,
    job_id: str,
    holder: str,
    lease_s: float,
    max_attempts: int,
    seq_range: tuple[int, int] | None = None,
    item_ids: Sequence[int] | None = None,
    now: datetime | None = None,
) -> OpenedOnPostgres | None:
    """Open a chunk of ``job_id`` (its ``seq_range`` [start, stop), or its ``item_ids``) for ``holder``
    in one statement; None if there is no such job. Nothing is leased if the job ended or is due."""
    now = now or utcnow()
    params: dict[str, Any] = {
        "job_id": job_id,
        "holder": holder,
        "now": now,
        "lease_until": now + timedelta(seconds=lease_s),
        "max_attempts": max_attempts,
    }
    if seq_range is not None:
        start, stop = seq_range
        params.update(start=start, stop=stop, size=max(0, stop - start))
        statement = OPEN_BY_RANGE
    else:
        params["ids"] = list(item_ids or [])
        statement = OPEN_BY_IDS
    row = connection.execute(statement, params).one_or_none()
    if row is None:
        return None
    return OpenedOnPostgres(row.status, bool(row.due), row.spec, row.queue, list(row.reserved))


def _merged(column: str) -> str:
    """The job's histogram plus the chunk's (parameter ``:column``), key by key ({} once recorded);
    counts as integers, ``rounds_by_rows`` (seconds among them) as floats."""
    number = "double precision" if column == "rounds_by_rows" else "bigint"
    return f"""coalesce((SELECT jsonb_object_agg(k, n) FROM (
        SELECT key AS k, sum(CAST(value AS {number})) AS n FROM (
            SELECT * FROM jsonb_each_text(coalesce(jobs.{column}, '{{}}'))
            UNION ALL SELECT * FROM jsonb_each_text(CAST(:{column} AS jsonb))) AS both_hists
        GROUP BY key) AS merged), '{{}}')"""


_MERGE_HISTOGRAMS = ", ".join(
    f"{name} = CASE WHEN :measured THEN {_merged(name)} ELSE jobs.{name} END" for name in HISTOGRAMS
)


@dataclass(frozen=True)
class ClosedChunk:
    """What ``close_chunk`` did: the ids it moved to done, and the job's row as it left it (what
    deriving its expected speedup reads; ``busy_seconds`` tells whether another chunk was recorded
    since: ``record_derived``)."""

    finished: set[int]
    status: str
    done: int
    failed: int
    total: int
    gamma_hist: dict[str, int] | None
    drafts_hist: dict[str, int] | None
    decode_rows: int
    decode_rounds: int
    draft_accepted: int
    draft_rejections: int
    busy_seconds: float

    @property
    def may_have_ended(self) -> bool:
        """Every item of the live job is counted done or failed (counted under the job's row lock
        by whoever finished it): ``jobs.finalize_job`` ends it if none is open."""
        return self.status not in TERMINAL_JOB_STATUSES and self.done + self.failed >= self.total


JOB_COLUMNS = tuple(name for name in ClosedChunk.__dataclass_fields__ if name != "finished")
# The job's row is read from the UPDATE (the newest version, under its lock, with every finish that
# committed before), or as the statement found it when nothing changed it.
CLOSE = text(
    f"""{FINISHED_CTES}, let_go AS (  -- the items it did not run: unleased, or their leases ended now
    UPDATE items SET claimed_by = CASE WHEN :interrupted THEN items.claimed_by END,
        lease_expires_at = CASE WHEN :interrupted THEN CAST(:now AS timestamptz) END
    WHERE items.id = ANY(CAST(:let_go AS bigint[])) AND items.claimed_by = :holder
      AND (items.status IS NOT DISTINCT FROM 'pending'
           OR (:interrupted AND items.status IS NOT DISTINCT FROM 'running'))
), job AS (
    UPDATE jobs SET {COUNTED},
        {", ".join(f"{name} = jobs.{name} + :{name}" for name in SUMS)},
        {_MERGE_HISTOGRAMS},
        last_draft_tokens = coalesce(:last_draft_tokens, jobs.last_draft_tokens)
    FROM summed WHERE jobs.id = :job_id AND (:measured OR summed.n > 0)
    RETURNING {", ".join(f"jobs.{name}" for name in JOB_COLUMNS)}
)
SELECT (SELECT coalesce(json_agg(id), '[]') FROM moved) AS finished, job_row.*
FROM (SELECT * FROM job
      UNION ALL SELECT {", ".join(JOB_COLUMNS)} FROM jobs WHERE id = :job_id AND NOT EXISTS (SELECT FROM job)
) AS job_row
"""
)


def close_chunk(
    connection: Connection,
    *,
    job_id: str,
    holder: str,
    finished: Sequence[tuple[Any, dict[str, Any]]],
    let_go: Sequence[int],
    interrupted: bool,
    measured: ChunkMeasurements | None,
    now: datetime | None = None,
) -> ClosedChunk | None:
    """Close a chunk in one statement: record its last ``finished`` items (fenced, as
    ``finishing.finish_and_claim`` does), let go of the items it did not run (``let_go``: unleased,
    or their leases ended now if ``interrupted``), add ``measured`` to the job's sums. None: no job."""
    now = now or utcnow()
    sums = asdict(measured) if measured is not None else {}
    params = finished_params(finished, job_id=job_id, holder=holder, now=now)
    params.update({name: sums.get(name, 0) for name in SUMS})
    params.update(
        let_go=list(let_go),
        interrupted=interrupted,
        measured=measured is not None,
        **{
            name: json.dumps({str(k): n for k, n in (getattr(measured, name) if measured else {}).items()})
            for name in HISTOGRAMS
        },
        last_draft_tokens=measured.last_draft_tokens if measured is not None else None,
    )
    row = connection.execute(CLOSE, params).one_or_none()
    if row is None:
        return None
    values = row._asdict()
    return ClosedChunk(**{**values, "finished": set(values["finished"])})


def record_derived(
    connection: Connection | Session, *, job_id: str, seen: ClosedChunk, values: dict[str, Any]
) -> bool:
    """Write what was derived from the job's sums as a chunk's close left them (its expected speedup,
    cost ratio, costs), unless another chunk was recorded since (its ``busy_seconds`` grew): that
    chunk derives from the newer sums, so the last write is the newest, as under the row lock. Alone
    (Postgres) or in a transaction (any database)."""
    written = connection.execute(
        update(Job).where(Job.id == job_id, Job.busy_seconds == seen.busy_seconds).values(**values)
    )
    return bool(cast("CursorResult[Any]", written).rowcount)
