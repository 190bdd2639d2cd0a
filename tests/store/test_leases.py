"""Leases, fencing, reclaiming, expiry and retries in genjob.store, on a real Postgres database."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis
from click.testing import CliRunner
from sqlalchemy import select, text

from genjob import store
from genjob.cli import main
from genjob.db import run_transaction, session_scope
from genjob.store import leases
from genjob.tables import Attempt, Item, Job, Result, utcnow
from tests.support.databases import REDIS_URL
from tests.support.prompts import write_jsonl
from tests.support.store import RESULT, new_job, reclaim

pytestmark = pytest.mark.usefixtures("end_jobs_left_open")  # tests.support.store's jobs


def claim(url: str, item_id: int, worker: str, *, now=None, max_attempts: int = 3):
    """The item claimed (a ClaimedItem), None if it is not claimable, or Refused.JOB_ENDED."""
    with session_scope(url) as session:
        job_id = session.get(Item, item_id).job_id
    claimed = run_transaction(
        url,
        store.claim_items,
        job_id=job_id,
        item_ids=[item_id],
        worker=worker,
        lease_s=10,
        max_attempts=max_attempts,
        now=now,
    )
    return claimed if claimed is store.Refused.JOB_ENDED else (claimed[0] if claimed else None)


def finish(url: str, claimed: store.ClaimedItem) -> bool:
    return bool(run_transaction(url, store.finish_items, finished=[(claimed, RESULT)], worker=claimed.job_id))


def fail(url: str, claimed: store.ClaimedItem, error: str) -> bool:
    return bool(run_transaction(url, store.fail_items, failed=[(claimed, error)], worker="w"))


def reserve(url: str, item_ids: list[int], worker: str, lease_s: float = 10) -> list[int]:
    with session_scope(url) as session:
        job_id = session.get(Item, item_ids[0]).job_id
    return run_transaction(
        url, leases.reserve_items, job_id=job_id, item_ids=item_ids, worker=worker, lease_s=lease_s
    )


def item(url: str, item_id: int) -> Item:
    with session_scope(url) as session:
        return session.get(Item, item_id)


def test_a_live_lease_keeps_others_off_and_an_expired_one_is_taken_over(pg_url: str) -> None:
    job_id, (first, second, _) = new_job(pg_url)
    assert reserve(pg_url, [first, second], "a/1") == [first, second]
    assert claim(pg_url, second, "b/2") is None  # reserved by a live worker
    claimed_a = claim(pg_url, first, "a/1")
    assert claim(pg_url, first, "b/2") is None  # running there

    later = utcnow() + timedelta(seconds=11)  # a/1 died: its lease ran out; a sweeper takes it back
    assert reclaim(pg_url, later)[job_id] == ("q", [0, 1])
    claimed_b = claim(pg_url, first, "b/2", now=later)
    assert (claimed_b.attempts, claimed_b.fence) == (2, 2)
    with session_scope(pg_url) as session:
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.item_id == first).order_by(Attempt.id)
        )
        assert list(outcomes) == ["lost"]  # b/2's try is written when it ends

    # a/1 was only frozen and now finishes: fenced off, nothing counted, b/2's result wins
    assert not finish(pg_url, claimed_a)
    assert finish(pg_url, claimed_b)
    with session_scope(pg_url) as session:
        assert session.get(Job, job_id).done == 1
        assert (
            session.scalar(select(text("count(*)")).select_from(Result).where(Result.item_id == first)) == 1
        )
        outcomes = session.scalars(
            select(Attempt.outcome).where(Attempt.item_id == first).order_by(Attempt.id)
        )
        assert list(outcomes) == ["lost", "superseded", "done"]  # a/1 did run that long, uselessly


def test_renewal_keeps_a_lease_and_release_gives_back_pending_items(pg_url: str) -> None:
    _, ids = new_job(pg_url)
    reserve(pg_url, ids, "a/1", lease_s=1)
    assert run_transaction(pg_url, leases.renew_leases, item_ids=ids, worker="a/1", lease_s=60) == 3
    assert run_transaction(pg_url, leases.renew_leases, item_ids=ids, worker="b/2", lease_s=60) == 0
    assert claim(pg_url, ids[0], "b/2", now=utcnow() + timedelta(seconds=5)) is None
    assert run_transaction(pg_url, leases.release_reservations, item_ids=ids, worker="a/1") == 3
    assert claim(pg_url, ids[0], "b/2") is not None


def test_an_item_that_used_all_its_tries_is_failed_when_its_last_worker_is_reclaimed(pg_url: str) -> None:
    """Say it kills its worker every time: each death costs a try, the third one ends it."""
    job_id, (victim, *_) = new_job(pg_url)
    now = utcnow()
    for attempt in range(3):
        assert claim(pg_url, victim, f"w/{attempt}", now=now) is not None
        now += timedelta(seconds=11)
        reclaimed = reclaim(pg_url, now)
        assert (job_id in reclaimed) == (attempt < 2)
    assert claim(pg_url, victim, "w/9", now=now) is None
    failed = item(pg_url, victim)
    assert (failed.status, failed.error) == ("failed", "gave up after 3 attempts; last: its worker was lost")
    with session_scope(pg_url) as session:
        assert session.get(Job, job_id).failed == 1


def test_reclaim_expired_leases_requeues_live_jobs_and_settles_ended_ones(pg_url: str) -> None:
    live_job, live_items = new_job(pg_url, 2)
    ended_job, ended_items = new_job(pg_url, 2)
    for item_id in (*live_items, *ended_items):
        claim(pg_url, item_id, "dead/1")
    with session_scope(pg_url) as session:
        store.cancel_job(session, job=session.get(Job, ended_job))
    later = utcnow() + timedelta(seconds=11)
    reclaimed = reclaim(pg_url, later)
    assert reclaimed[live_job] == ("q", [0, 1]) and ended_job not in reclaimed
    assert [item(pg_url, i).status for i in live_items] == ["pending", "pending"]
    assert [item(pg_url, i).claimed_by for i in live_items] == [None, None]
    assert [item(pg_url, i).status for i in ended_items] == ["cancelled", "cancelled"]
    assert reclaim(pg_url, later) == {}


def test_expire_due_jobs_ends_them_and_their_unstarted_items(pg_url: str) -> None:
    due, due_items = new_job(pg_url, expires_at=utcnow() + timedelta(seconds=5))
    not_due, _ = new_job(pg_url, expires_at=utcnow() + timedelta(hours=1))
    running = claim(pg_url, due_items[0], "w/1")
    assert run_transaction(pg_url, store.expire_due_jobs, now=utcnow() + timedelta(seconds=6)) == [due]
    assert claim(pg_url, due_items[1], "w/1") is store.Refused.JOB_ENDED
    with session_scope(pg_url) as session:
        assert session.get(Job, due).status == "expired" and session.get(Job, not_due).status == "queued"
    assert [item(pg_url, i).status for i in due_items] == ["running", "expired", "expired"]
    # the item in flight finishes and is kept
    assert finish(pg_url, running)


def test_retry_failed_items_moves_only_failed_items_and_reopens_the_job(pg_url: str) -> None:
    job_id, (ok, bad, _) = new_job(pg_url)
    done, failed = claim(pg_url, ok, "w/1"), claim(pg_url, bad, "w/1")
    assert finish(pg_url, done) and fail(pg_url, failed, "boom")
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        job.status = "completed"
        session.flush()
        assert store.retry_failed_items(session, job=job) == 1
        assert (job.status, job.done, job.failed, job.finished_at) == ("queued", 1, 0, None)
    assert (item(pg_url, bad).status, item(pg_url, bad).attempts, item(pg_url, bad).error) == (
        "pending",
        0,
        None,
    )
    assert item(pg_url, ok).status == "done"
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        store.cancel_job(session, job=job)
        with pytest.raises(ValueError, match="ended cancelled"):
            store.retry_failed_items(session, job=job)


def test_pending_item_chunks_pages_in_input_order_and_skips_live_leases(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.queued, "PAGE_SIZE", 3)
    job_id, ids = new_job(pg_url, 10)
    with session_scope(pg_url) as session:
        assert list(store.pending_item_chunks(session, job_id=job_id, chunk_size=4)) == [
            ids[:4],
            ids[4:8],
            ids[8:],
        ]
    reserve(pg_url, ids[2:5], "a/1")
    with session_scope(pg_url) as session:
        chunks = store.pending_item_chunks(session, job_id=job_id, chunk_size=4, unleased_at=utcnow())
        assert list(chunks) == [ids[:2] + ids[5:7], ids[7:]]
        ranges = store.pending_ranges(session, job_id=job_id, chunk_size=4, unleased_at=utcnow())
        assert list(ranges) == [(0, 2), (5, 9), (9, 10)]  # seq ranges spanning at most 4 positions


def test_run_transaction_retries_after_its_connection_is_terminated(pg_url: str) -> None:
    calls = []

    def flaky(session) -> int:
        calls.append(1)
        if len(calls) == 1:
            session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return session.execute(text("SELECT 42")).scalar_one()

    assert run_transaction(pg_url, flaky, retry_s=10) == 42
    assert len(calls) == 2


def test_expiry_without_any_worker_shows_in_genjob_status(
    pg_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nobody consumes this queue: `genjob status` itself ends the job once its deadline passed."""
    queue = f"gpu-test-idle-{uuid.uuid4().hex[:8]}"
    for key, value in {"DATABASE_URL": pg_url, "BROKER_URL": REDIS_URL, "QUEUE": queue}.items():
        monkeypatch.setenv(f"GENJOB_{key}", value)
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}'])
    runner = CliRunner()
    submitted = runner.invoke(main, ["submit", str(tmp_path / "p.jsonl"), "-m", "m", "--expire-after", "1m"])
    job_id = submitted.output.strip()
    assert runner.invoke(main, ["status", job_id]).output.splitlines()[1] == "status:    queued"
    with session_scope(pg_url) as session:  # a minute later
        session.get(Job, job_id).expires_at = utcnow() - timedelta(seconds=1)
    lines = runner.invoke(main, ["status", job_id]).output.splitlines()
    assert lines[1] == "status:    expired"
    assert lines[-1].startswith("error:     expired: not finished by ")
    with session_scope(pg_url) as session:
        assert set(session.scalars(select(Item.status).where(Item.job_id == job_id))) == {"expired"}
    redis.Redis.from_url(REDIS_URL).delete(queue)


def test_a_stale_try_is_refused_after_a_retry_reset_the_attempt_budget(pg_url: str) -> None:
    """The fence is not the attempt count: a retry gives the item a fresh budget (attempts 0) but
    its fence keeps rising, so a frozen worker's late result cannot pass for the new try's."""
    job_id, (bad, *_) = new_job(pg_url)
    stale = claim(pg_url, bad, "w/1")  # try 1, fence 1; then it froze past its lease
    later = utcnow() + timedelta(seconds=11)
    reclaim(pg_url, later)
    second = claim(pg_url, bad, "w/2", now=later)
    assert fail(pg_url, second, "boom")
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        job.status = "completed"
        session.flush()
        assert store.retry_failed_items(session, job=job) == 1
        assert store.retry_failed_items(session, job=job) == 0  # safe to repeat
    assert (item(pg_url, bad).attempts, item(pg_url, bad).fence) == (0, 2)
    third = claim(pg_url, bad, "w/3")
    assert (third.attempts, third.fence) == (1, 3)
    assert (stale.attempts, stale.fence) == (1, 1)
    assert not finish(pg_url, stale)  # the stale worker's late result: refused
    assert finish(pg_url, third)
    with session_scope(pg_url) as session:
        assert session.get(Job, job_id).done == 1
        outcomes = session.scalars(select(Attempt.outcome).where(Attempt.item_id == bad).order_by(Attempt.id))
        assert list(outcomes) == ["lost", "failed", "superseded", "done"]


def test_claims_and_writes_are_set_based(pg_url: str) -> None:
    """A group of items is claimed in one statement and finished in a few, whatever its size."""
    from sqlalchemy import event

    from genjob.db import get_engine

    job_id, ids = new_job(pg_url, 32)
    statements: list[str] = []
    engine = get_engine(pg_url)

    def count(conn, cursor, statement, *args) -> None:
        statements.append(statement.split()[0])

    event.listen(engine, "before_cursor_execute", count)
    try:
        claimed = run_transaction(
            pg_url, store.claim_items, job_id=job_id, item_ids=ids, worker="w/1", lease_s=10, max_attempts=3
        )
        assert [c.id for c in claimed] == ids
        claim_statements = len(statements)
        accepted = run_transaction(
            pg_url, store.finish_items, finished=[(c, RESULT) for c in claimed], worker="w/1"
        )
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert accepted == set(ids)
    assert claim_statements <= 3  # the job's row, the UPDATE … RETURNING (and a pre-ping)
    assert len(statements) - claim_statements <= 5  # items, attempts, results, the job's sums (+ ping)
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        assert (job.done, job.new_tokens) == (32, 32)
