"""A job as its rows say: the row itself, its end, its leases and attempts, and the exactly-once checks."""

from __future__ import annotations

from sqlalchemy import func, select, text

from genjob.db import get_engine, session_scope
from genjob.tables import Item, Job
from tests.support.waiting import wait_for

ENDED = ("completed", "failed", "cancelled", "expired")


def job_row(pg_url: str, job_id: str) -> Job:
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id, populate_existing=True)
        assert job is not None, f"no job {job_id}"
        return job


def wait_for_job_end(pg_url: str, job_id: str, *, timeout: float = 90, every: float = 0.1) -> Job:
    return wait_for(
        lambda: (job := job_row(pg_url, job_id)).status in ENDED and job,
        timeout=timeout,
        what=f"job {job_id} to end",
        every=every,
    )


def stored_counts(url: str) -> tuple[int, int]:
    """How many jobs and items the database holds (a refused submit stores neither)."""
    with session_scope(url) as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        return jobs, session.scalar(select(func.count()).select_from(Item)) or 0


def count(pg_url: str, sql: str, job_id: str) -> int:
    """``sql`` (a count, with ``:job`` for the job's id) on the job."""
    with get_engine(pg_url).connect() as connection:
        return connection.execute(text(sql), {"job": job_id}).scalar_one()


def live_leases(pg_url: str, job_id: str) -> int:
    """Items of the job a worker holds now."""
    sql = "SELECT count(*) FROM items WHERE job_id = :job AND lease_expires_at > now()"
    return count(pg_url, sql, job_id)


def lost_attempts(pg_url: str, job_id: str) -> int:
    """Tries of the job's items that ended with their worker (closed when their leases ran out)."""
    return count(pg_url, "SELECT count(*) FROM attempts WHERE job_id = :job AND outcome = 'lost'", job_id)


EXACTLY_ONCE_COUNTS = {
    "items": "SELECT count(*) FROM items WHERE job_id = :job",
    "done_items": "SELECT count(*) FROM items WHERE job_id = :job AND status = 'done'",
    "results": "SELECT count(*) FROM results WHERE job_id = :job",
    "items_with_one_result": """
        SELECT count(*) FROM items i WHERE i.job_id = :job
        AND (SELECT count(*) FROM results r WHERE r.item_id = i.id) = 1""",
    "results_matching_prompt": """
        SELECT count(*) FROM results r JOIN items i ON i.id = r.item_id
        WHERE r.job_id = :job AND r.output = 'echo: ' || i.prompt""",
    "done_attempts": """
        SELECT count(*) FROM attempts a JOIN items i ON i.id = a.item_id
        WHERE i.job_id = :job AND a.outcome = 'done'""",
    "open_attempts": """
        SELECT count(*) FROM attempts a JOIN items i ON i.id = a.item_id
        WHERE i.job_id = :job AND a.finished_at IS NULL""",
    "overlapping_attempts": """
        SELECT count(*) FROM attempts a JOIN attempts b ON a.item_id = b.item_id AND a.id < b.id
        JOIN items i ON i.id = a.item_id
        WHERE i.job_id = :job
        AND a.started_at < coalesce(b.finished_at, 'infinity')
        AND b.started_at < coalesce(a.finished_at, 'infinity')""",
    "job_done_counter": "SELECT done FROM jobs WHERE id = :job",
}


def exactly_once_report(pg_url: str, job_id: str) -> dict[str, int]:
    """Counts that prove exactly-once: results per item, done attempts, overlapping attempts."""
    return {name: count(pg_url, sql, job_id) for name, sql in EXACTLY_ONCE_COUNTS.items()}


def assert_exactly_once(pg_url: str, job_id: str, items: int) -> dict[str, int]:
    """Every one of the job's ``items`` done once: one result each (the scripted stand-in's echo of its
    prompt), one done attempt, none open, no two at once, and the job's counter says so."""
    report = exactly_once_report(pg_url, job_id)
    assert report == {
        "items": items,
        "done_items": items,
        "results": items,
        "items_with_one_result": items,
        "results_matching_prompt": items,
        "done_attempts": items,
        "open_attempts": 0,
        "overlapping_attempts": 0,
        "job_done_counter": items,
    }
    return report
