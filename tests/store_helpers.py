"""Jobs, items and results for the store's tests on a real Postgres (test_leases, test_hot_path), and
the fixture that ends the jobs they leave open (import it into the test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from genjob import store
from genjob.db import run_transaction, session_scope
from genjob.formats.reader import PromptItem
from genjob.options import JobSpec
from genjob.store import leases
from genjob.tables import Item, Job

RESULT = {
    "output": "x",
    "finish_reason": "length",
    "mode": "none",
    "prompt_tokens": 1,
    "new_tokens": 1,
    "target_rounds": 1,
    "draft_proposed": 0,
    "draft_accepted": 0,
    "draft_rejections": 0,
    "latency_s": 0.1,
    "worker": "w",
}


@pytest.fixture(autouse=True)
def end_jobs_left_open(pg_url: str) -> Iterator[None]:
    """Jobs left open here would be queued again by a later test's worker (broker recovery)."""
    yield
    with session_scope(pg_url) as session:
        session.execute(
            update(Job)
            .where(Job.queue == "q", Job.status.in_(["queued", "running"]))
            .values(status="cancelled")
        )


def new_job(url: str, n: int = 3, **kwargs) -> tuple[str, list[int]]:
    with session_scope(url) as session:
        job = store.create_job(
            session,
            spec=JobSpec(model="m", mode="none"),
            items=[PromptItem(i, i + 1, f"p{i}", None, None) for i in range(n)],
            queue="q",
            **kwargs,
        )
        ids = session.scalars(select(Item.id).where(Item.job_id == job.id).order_by(Item.seq)).all()
        return job.id, list(ids)


def reclaim(url: str, now, **kwargs):
    return run_transaction(url, leases.reclaim_expired_leases, now=now, max_attempts=3, **kwargs)
