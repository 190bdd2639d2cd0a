"""The workers' hot path on a real Postgres: a group's write and the next claim in one statement
(``store.finish_and_claim`` in autocommit), fenced like the transaction path, and its statements
reaching items by key, never by every pending item of the job."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.orm import Session

from genjob import store
from genjob.db import get_engine, run_statement, run_transaction, session_scope
from genjob.store import leases
from genjob.tables import Attempt, Item, Job, utcnow
from tests.support.store import RESULT, new_job, reclaim

pytestmark = pytest.mark.usefixtures("end_jobs_left_open")  # tests.support.store's jobs


def finish_and_claim(url: str, job_id: str, finished: list, claim: list[int], holder: str = "w/1"):
    return run_statement(
        url,
        store.finish_and_claim,
        job_id=job_id,
        holder=holder,
        finished=[(item, RESULT) for item in finished],
        claim=claim,
        lease_s=10,
        max_attempts=3,
    )


def claimed_items(job_id: str, result: Any) -> list[store.ClaimedItem]:
    return [store.ClaimedItem(job_id=job_id, started_at=result.now, **row) for row in result.claimed]


def test_a_group_is_written_and_the_next_claimed_in_one_statement_without_begin_or_commit(
    pg_url: str,
) -> None:
    job_id, ids = new_job(pg_url, 6)
    sent: list[str] = []
    engine = get_engine(pg_url, False)

    def count(conn, cursor, statement, *args) -> None:
        sent.append(statement.split()[0])

    event.listen(engine, "before_cursor_execute", count)
    try:
        first = finish_and_claim(pg_url, job_id, [], ids[:3])
        group = claimed_items(job_id, first)
        second = finish_and_claim(pg_url, job_id, group, ids[3:])
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(sent) == 2  # one statement per call; autocommit: no BEGIN, no COMMIT
    assert first.done == set() and [(c.id, c.attempts, c.fence) for c in group] == [
        (i, 1, 1) for i in ids[:3]
    ]
    assert second.done == set(ids[:3]) and second.job_status == "queued" and not second.due
    assert sorted(row["id"] for row in second.claimed) == ids[3:]
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        assert (job.done, job.new_tokens, job.generate_seconds) == (3, 3, pytest.approx(0.3))
        statuses = dict(session.execute(select(Item.id, Item.status).where(Item.job_id == job_id)).all())
        assert [statuses[i] for i in ids] == ["done"] * 3 + ["running"] * 3
        outcomes = session.scalars(select(Attempt.outcome).where(Attempt.job_id == job_id)).all()
        assert outcomes == ["done"] * 3


def test_a_stale_result_is_refused_and_an_ended_job_claims_nothing(pg_url: str) -> None:
    job_id, ids = new_job(pg_url, 4)
    stale = claimed_items(job_id, finish_and_claim(pg_url, job_id, [], ids[:1]))
    later = utcnow().replace(year=utcnow().year + 1)  # its lease long over: another worker takes it
    reclaim(pg_url, later)
    taken = run_transaction(
        pg_url,
        store.claim_items,
        job_id=job_id,
        item_ids=ids[:1],
        worker="w/2",
        lease_s=10,
        max_attempts=3,
        now=later,
    )
    assert [c.fence for c in taken] == [2]
    with session_scope(pg_url) as session:
        store.cancel_job(session, job=session.get(Job, job_id))
    result = finish_and_claim(pg_url, job_id, stale, ids[1:])
    assert result.done == set() and result.claimed == [] and result.job_status == "cancelled"
    with session_scope(pg_url) as session:
        assert session.get(Job, job_id).done == 0
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.item_id == ids[0]).order_by(Attempt.id)
        )
        assert list(outcomes) == ["lost", "superseded"]
        assert session.get(Item, ids[0]).status == "running"  # the new holder's try, untouched
    # the in-flight item of a cancelled job still finishes, counted once
    assert run_transaction(pg_url, store.finish_items, finished=[(taken[0], RESULT)], worker="w/2") == {
        ids[0]
    }


def test_hot_path_statements_reach_items_by_key_not_by_every_pending_item(pg_url: str) -> None:
    """With a fresh job's statistics the planner served (job_id, status) conditions from
    ix_items_job_id_status and read every pending item of the job per group: O(items²) a job."""
    job_id, _ = new_job(pg_url, 2000)
    with get_engine(pg_url).connect() as connection:
        try:
            connection.execute(text("LOAD 'auto_explain'"))
        except Exception as exc:  # a server without the contrib module
            pytest.skip(f"auto_explain: {exc}")
        for setting in ("log_min_duration = 0", "log_level = notice", "log_nested_statements = on"):
            connection.execute(text(f"SET auto_explain.{setting}"))
        plans: list[str] = []
        connection.connection.driver_connection.add_notice_handler(lambda n: plans.append(n.message_primary))
        session = Session(bind=connection)
        reserved = leases.reserve_items(
            session, job_id=job_id, worker="w/1", lease_s=10, seq_range=(500, 564)
        )
        claimed = store.claim_items(
            session, job_id=job_id, item_ids=reserved[:16], worker="w/1", lease_s=10, max_attempts=3
        )
        store.finish_items(session, finished=[(c, RESULT) for c in claimed], worker="w/1")
        connection.commit()
        result = store.finish_and_claim(
            connection,
            job_id=job_id,
            holder="w/1",
            finished=[],
            claim=reserved[16:32],
            lease_s=10,
            max_attempts=3,
        )
        store.finish_and_claim(
            connection,
            job_id=job_id,
            holder="w/1",
            finished=[(c, RESULT) for c in claimed_items(job_id, result)],
            claim=[],
            lease_s=10,
            max_attempts=3,
        )
        connection.commit()
        # a chunk's open and close (store.postgres_chunk_ends)
        opened = store.open_chunk(
            connection, job_id=job_id, holder="w/1", lease_s=10, max_attempts=3, seq_range=(600, 664)
        )
        assert opened is not None and len(opened.reserved) == 64
        store.close_chunk(
            connection,
            job_id=job_id,
            holder="w/1",
            finished=[],
            let_go=opened.reserved,
            interrupted=False,
            measured=None,
        )
        connection.commit()
    items_plans = [plan for plan in plans if "items" in plan and "Query Text" in plan]
    assert len(items_plans) >= 7
    bad = [plan for plan in items_plans if "ix_items_job_id_status" in plan]
    assert not bad, "\n\n".join(bad)
