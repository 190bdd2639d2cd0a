"""Postgres: a whole group of finished items recorded in one statement (data-modifying CTEs).

The fenced move to ``done``, an attempt row each (``superseded`` where the fence moved on), the
results upserted and the job's sums, from one JSON parameter: one round trip for the group. SQLite
(embedded mode) takes ``genjob.store.items``' Core statements instead.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from genjob.tables import utcnow

SUMMED = ("new_tokens", "target_rounds", "draft_proposed", "draft_accepted", "draft_rejections")
RESULT_COLUMNS = {
    "output": "text",
    "finish_reason": "text",
    "mode": "text",
    "prompt_tokens": "int",
    "new_tokens": "int",
    "target_rounds": "int",
    "draft_proposed": "int",
    "draft_accepted": "int",
    "draft_rejections": "int",
    "gamma_mean": "float8",
    "latency_s": "float8",
    "lossless_match": "bool",
    "worker": "text",
}
# Postgres: a group's whole finish in one statement (data-modifying CTEs): the fenced move to done,
# an attempt row each, the results upserted and the job's sums, from one JSON parameter.
FINISH_ON_POSTGRES = text(
    f"""
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
), counted AS (
    UPDATE jobs SET done = jobs.done + summed.n,
        {", ".join(f"{name} = jobs.{name} + summed.{name}" for name in SUMMED)},
        generate_seconds = jobs.generate_seconds + summed.latency_s,
        lossless_checked = jobs.lossless_checked + summed.checked,
        lossless_matches = jobs.lossless_matches + summed.matches
    FROM summed WHERE jobs.id = :job_id AND summed.n > 0
)
SELECT id FROM moved
"""
)


def finish_on_postgres(
    session: Session, *, job_id: str, finished: Sequence[tuple[Any, dict[str, Any]]], holder: str
) -> set[int]:
    rows = [
        {"item_id": item.id, "fence": item.fence, "started_at": item.started_at.isoformat(), **row}
        for item, row in finished
    ]
    params = {
        "rows": json.dumps(rows),
        "ids": [item.id for item, _ in finished],
        "now": utcnow(),
        "job_id": job_id,
        "holder": holder,
    }
    return set(session.scalars(FINISH_ON_POSTGRES, params))
