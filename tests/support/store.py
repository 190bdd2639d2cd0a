"""Jobs, items and results for the store's tests on a real Postgres (on queue ``q``: the fixture
``end_jobs_left_open`` ends the jobs they leave open)."""

from __future__ import annotations

from sqlalchemy import select

from genjob import store
from genjob.db import run_transaction, session_scope
from genjob.formats.reader import PromptItem
from genjob.options import JobSpec
from genjob.store import leases
from genjob.tables import Item, Result

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


def result_of(**columns) -> Result:
    """A ``Result`` row: ``RESULT``'s values, and ``columns`` (its keys, its item's, any other) over them."""
    return Result(**{**RESULT, **columns})


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
