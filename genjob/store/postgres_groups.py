"""Postgres only: a whole group of finished items recorded in one statement (data-modifying CTEs).

The fenced move to ``done``, an attempt row each (``superseded`` where the fence moved on), the
results upserted and the job's sums, from one JSON parameter: one round trip for the group. The item
loop's hot path (``finish_and_claim``) also claims the next group in that same statement, run alone
in autocommit: one round trip per group, no BEGIN or COMMIT, and the job's row stays locked only
while the server runs it (not across the worker's round trips, where the other workers would queue
for it). SQLite (embedded mode) takes ``genjob.store.items``' Core statements instead.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from genjob.constants import TERMINAL_JOB_STATUSES
from genjob.store.claims import CLAIMED_COLUMNS
from genjob.tables import RESULT_FIELDS, Result, utcnow

SUMMED = ("new_tokens", "target_rounds", "draft_proposed", "draft_accepted", "draft_rejections")
# The result columns (``tables.RESULT_FIELDS``) and their Postgres types, for ``jsonb_to_recordset``.
RESULT_COLUMNS = {
    name: Result.__table__.columns[name].type.compile(dialect=postgresql.dialect())  # type: ignore[no-untyped-call]
    for name in RESULT_FIELDS
}
# Postgres: a group's whole finish in one statement (data-modifying CTEs): the fenced move to done,
# an attempt row each, the results upserted and the job's sums, from one JSON parameter.
FINISHED_CTES = f"""
WITH fin AS (
    SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
        item_id bigint, fence bigint, started_at timestamptz,
        {", ".join(f"{name} {kind}" for name, kind in RESULT_COLUMNS.items())})
), moved AS (
    UPDATE items SET status = 'done', error = NULL, finished_at = :now, lease_expires_at = NULL
    FROM fin WHERE items.id = ANY(CAST(:ids AS bigint[]))  -- by primary key only (leases.unindexed_eq)
        AND items.id = fin.item_id AND items.fence = fin.fence AND items.status IS NOT DISTINCT FROM 'running'
    RETURNING items.id
), tried AS (
    INSERT INTO attempts (job_id, item_id, worker, started_at, finished_at, outcome)
    SELECT :job_id, fin.item_id, :holder, fin.started_at, :now,
           CASE WHEN moved.id IS NULL THEN 'superseded' ELSE 'done' END
    FROM fin LEFT JOIN moved ON moved.id = fin.item_id
), written AS (
    INSERT INTO results (job_id, item_id, created_at, {", ".join(RESULT_COLUMNS)})
    SELECT :job_id, fin.item_id, :now, {", ".join(f"fin.{name}" for name in RESULT_COLUMNS)}
    FROM fin JOIN moved ON moved.id = fin.item_id
    ON CONFLICT (job_id, item_id) DO UPDATE SET
        created_at = EXCLUDED.created_at, {", ".join(f"{name} = EXCLUDED.{name}" for name in RESULT_COLUMNS)}
), summed AS (
    SELECT count(*) AS n, {", ".join(f"coalesce(sum(fin.{name}), 0) AS {name}" for name in SUMMED)},
           coalesce(sum(fin.latency_s), 0) AS latency_s,
           count(fin.lossless_match) AS checked,
           count(*) FILTER (WHERE fin.lossless_match) AS matches
    FROM fin JOIN moved ON moved.id = fin.item_id
)"""
# The group's sums added to the job's (an UPDATE's SET list, FROM summed).
COUNTED = f"""done = jobs.done + summed.n,
        {", ".join(f"{name} = jobs.{name} + summed.{name}" for name in SUMMED)},
        generate_seconds = jobs.generate_seconds + summed.latency_s,
        lossless_checked = jobs.lossless_checked + summed.checked,
        lossless_matches = jobs.lossless_matches + summed.matches"""
_COUNT = f"""
    UPDATE jobs SET {COUNTED}
    FROM summed WHERE jobs.id = :job_id"""
FINISH_ON_POSTGRES = text(f"{FINISHED_CTES}, counted AS ({_COUNT} AND summed.n > 0)\nSELECT id FROM moved")
ENDED = ", ".join(f"'{status}'" for status in sorted(TERMINAL_JOB_STATUSES))
# The same, then the next group claimed (what store.items.claim_items does, fenced alike). The job's
# row is updated (its sums; +0 when nothing finished) before any item is claimed and its status read
# under that lock: a cancel or expiry that commits first is seen (nothing claimed); one that comes
# later waits for this statement. Items are reached by primary key only (leases.unindexed_eq).
FINISH_AND_CLAIM_ON_POSTGRES = text(
    f"""{FINISHED_CTES}, job AS ({_COUNT}
    RETURNING jobs.status, jobs.expires_at
), claimed AS (
    UPDATE items SET status = 'running', attempts = items.attempts + 1, fence = items.fence + 1,
        started_at = :now, claimed_by = :holder, lease_expires_at = :lease_until
    WHERE items.id = ANY(CAST(:claim AS bigint[]))
      AND EXISTS (SELECT FROM job WHERE job.status NOT IN ({ENDED})
                  AND (job.expires_at IS NULL OR job.expires_at > :now))
      AND items.job_id IS NOT DISTINCT FROM :job_id AND items.status IS NOT DISTINCT FROM 'pending'
      AND items.attempts < :max_attempts
      AND (items.claimed_by IS NULL OR items.lease_expires_at <= :now OR items.claimed_by = :holder)
    RETURNING {", ".join(f"items.{name}" for name in CLAIMED_COLUMNS)}
)
SELECT (SELECT coalesce(json_agg(id), '[]') FROM moved) AS done,
       (SELECT coalesce(json_agg(json_build_array({", ".join(CLAIMED_COLUMNS)})
                             ORDER BY array_position(CAST(:claim AS bigint[]), id)), '[]')
        FROM claimed) AS claimed,
       (SELECT status FROM job) AS job_status,
       (SELECT expires_at <= :now FROM job) AS job_due
"""
)


def finished_params(
    finished: Sequence[tuple[Any, dict[str, Any]]], *, job_id: str, holder: str, now: datetime
) -> dict[str, Any]:
    rows = [
        {"item_id": item.id, "fence": item.fence, "started_at": item.started_at.isoformat(), **row}
        for item, row in finished
    ]
    ids = [item.id for item, _ in finished]
    return {"rows": json.dumps(rows), "ids": ids, "now": now, "job_id": job_id, "holder": holder}


def finish_on_postgres(
    session: Session, *, job_id: str, finished: Sequence[tuple[Any, dict[str, Any]]], holder: str
) -> set[int]:
    params = finished_params(finished, job_id=job_id, holder=holder, now=utcnow())
    return set(session.scalars(FINISH_ON_POSTGRES, params))


@dataclass(frozen=True)
class FinishedAndClaimed:
    """What ``finish_and_claim`` did: the ids it moved to done, the items it claimed (``CLAIMED_COLUMNS``
    by name; each started at ``now``) and the job's status; ``due``: past its deadline, not yet expired."""

    done: set[int]
    claimed: list[dict[str, Any]]  # in the order they were asked for
    now: datetime
    job_status: str | None
    due: bool

    @property
    def job_ended(self) -> bool:
        """The job ended, or is past its deadline (a claim in a transaction would expire it)."""
        return self.job_status in TERMINAL_JOB_STATUSES or self.due


def finish_and_claim(
    connection: Connection,
    *,
    job_id: str,
    holder: str,
    finished: Sequence[tuple[Any, dict[str, Any]]],
    claim: Sequence[int],
    lease_s: float,
    max_attempts: int,
    now: datetime | None = None,
) -> FinishedAndClaimed:
    """Record ``finished`` (one job's) and claim the items ``claim`` of ``job_id``, one statement:
    run it on a connection in autocommit (``genjob.db.run_statement``), it is atomic by itself."""
    now = now or utcnow()
    params = finished_params(finished, job_id=job_id, holder=holder, now=now)
    params.update(claim=list(claim), max_attempts=max_attempts, lease_until=now + timedelta(seconds=lease_s))
    row = connection.execute(FINISH_AND_CLAIM_ON_POSTGRES, params).one()
    claimed = [dict(zip(CLAIMED_COLUMNS, values, strict=True)) for values in row.claimed]
    return FinishedAndClaimed(set(row.done), claimed, now, row.job_status, bool(row.job_due))
