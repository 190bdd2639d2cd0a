"""A chunk's bookkeeping on a real Postgres: opened and closed in one autocommit statement each
(``store.open_chunk`` / ``store.close_chunk``), the same rows as the transaction path (SQLite's),
the job ended by the close whose counters add up, and one lease-renewal thread per process."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.engine import Engine

from genjob import store
from genjob.db import get_engine, run_statement, run_transaction, session_scope
from genjob.settings import Settings
from genjob.store import chunks as chunk_stores
from genjob.tables import Attempt, Item, Job, utcnow
from genjob.worker import chunks
from tests.support.jobs import job_row
from tests.support.store import RESULT, new_job
from tests.support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("end_jobs_left_open")  # tests.support.store's jobs


@pytest.fixture
def sent() -> Iterator[Counter[str]]:
    """What every engine of this process sends: statements by their first word, BEGINs, COMMITs."""
    counts: Counter[str] = Counter()

    def statement(conn, cursor, sql, *args) -> None:
        counts[sql.split()[0].upper()] += 1

    def begin(conn) -> None:
        if not getattr(conn.connection.driver_connection, "autocommit", False):
            counts["BEGIN"] += 1

    event.listen(Engine, "before_cursor_execute", statement)
    event.listen(Engine, "begin", begin)
    yield counts
    event.remove(Engine, "before_cursor_execute", statement)
    event.remove(Engine, "begin", begin)


def measured(busy: float = 0.5, hist: dict[int, int] | None = None) -> store.ChunkMeasurements:
    return store.ChunkMeasurements(
        busy_seconds=busy,
        decode_rounds=4,
        decode_rows=40,
        decode_tokens=40,
        decode_seconds=0.25,
        probe_rounds=1,
        probe_tokens=3,
        probe_seconds=0.125,
        probe_sq=0.5,
        prefill_seconds=0.0625,
        gamma_hist=hist if hist is not None else {2: 3, 4: 1},
        last_draft_tokens=4,
        drafts_hist={m: 2 * n for m, n in (hist if hist is not None else {2: 3, 4: 1}).items()} | {0: 1},
        rounds_by_rows={"3:rounds": 3.0, "3:seconds": 0.1875, "3:plain_rounds": 1.0, "1:seconds": 0.0625},
    )


def open_chunk(url: str, job_id: str, seq_range: tuple[int, int], holder: str = "w/1", **kwargs):
    return run_statement(
        url,
        store.open_chunk,
        job_id=job_id,
        holder=holder,
        lease_s=30,
        max_attempts=3,
        seq_range=seq_range,
        **kwargs,
    )


def close_chunk(url: str, job_id: str, holder: str = "w/1", **kwargs):
    kwargs = {"finished": [], "let_go": [], "interrupted": False, "measured": None} | kwargs
    return run_statement(url, store.close_chunk, job_id=job_id, holder=holder, **kwargs)


def test_open_leases_the_range_marks_the_job_running_and_fails_items_out_of_tries(
    pg_url: str, sent: Counter[str]
) -> None:
    job_id, ids = new_job(pg_url, 6)
    with session_scope(pg_url) as session:
        session.execute(update(Item).where(Item.id == ids[1]).values(attempts=3, error="boom"))
        session.execute(
            update(Item)
            .where(Item.id == ids[2])
            .values(claimed_by="w/2", lease_expires_at=utcnow() + timedelta(seconds=60))
        )
    sent.clear()
    opened = open_chunk(pg_url, job_id, (0, 4))
    assert dict(sent) == {"WITH": 1}  # one statement, autocommit
    assert opened.status == "queued" and not opened.job_ended and opened.queue == "q"
    assert opened.reserved == [ids[0], ids[3]]  # ids[2]: another live worker's; ids[4:]: out of range
    job = job_row(pg_url, job_id)
    assert job.status == "running" and job.started_at is not None and job.failed == 1
    with session_scope(pg_url) as session:
        gave_up = session.get_one(Item, ids[1])
        assert (gave_up.status, gave_up.error) == ("failed", "gave up after 3 attempts; last: boom")
        held = session.scalars(select(Item.id).where(Item.job_id == job_id, Item.claimed_by == "w/1")).all()
        assert sorted(held) == [ids[0], ids[1], ids[3]]  # as reserve_items leaves them
    # a duplicate delivery leases nothing more; an old-format message names ids
    assert open_chunk(pg_url, job_id, (0, 4), holder="w/3").reserved == []
    assert open_chunk(pg_url, job_id, None, item_ids=ids[4:], holder="w/3").reserved == ids[4:]


def test_open_leases_nothing_once_the_job_ended_or_is_due(pg_url: str) -> None:
    job_id, _ = new_job(pg_url, 2, expires_at=utcnow() - timedelta(seconds=1))
    due = open_chunk(pg_url, job_id, (0, 2))
    assert due.due and due.job_ended and due.reserved == []
    assert job_row(pg_url, job_id).status == "queued"  # the caller expires it (expire_due_jobs)
    cancelled, _ = new_job(pg_url, 2)
    with session_scope(pg_url) as session:
        store.cancel_job(session, job=session.get_one(Job, cancelled))
    assert open_chunk(pg_url, cancelled, (0, 2)).reserved == []
    assert open_chunk(pg_url, "no-such-job", (0, 2)) is None


def test_open_locks_the_job_before_its_items_as_a_cancel_does(pg_url: str) -> None:
    """A cancel locks the job's row, then its items: an open that took the items first and then waited
    for the row would deadlock with it. While another transaction holds the row, the open waits
    holding no item."""
    job_id, ids = new_job(pg_url, 4)
    engine = get_engine(pg_url)
    opened: list = []
    with engine.connect() as holder, engine.connect() as other:
        holder.execute(text("SELECT 1 FROM jobs WHERE id = :job FOR UPDATE"), {"job": job_id})
        thread = threading.Thread(target=lambda: opened.append(open_chunk(pg_url, job_id, (0, 4))))
        thread.start()
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%gave_up%'"
        )
        wait_for(
            lambda: other.execute(waiting).scalar_one(), timeout=30, what="the open to wait for the job's row"
        )
        other.rollback()
        free = other.execute(
            text("SELECT count(*) FROM (SELECT id FROM items WHERE job_id = :job FOR UPDATE NOWAIT) AS x"),
            {"job": job_id},
        ).scalar_one()
        assert free == 4  # no item is locked by the waiting open
        other.rollback()
        holder.rollback()
        thread.join(timeout=30)
    assert opened and opened[0].reserved == ids


def test_close_writes_the_last_group_lets_go_and_adds_what_was_measured_as_record_chunk_does(
    pg_url: str, sent: Counter[str]
) -> None:
    job_id, _ = new_job(pg_url, 4)
    mine = open_chunk(pg_url, job_id, (0, 4)).reserved
    claimed = run_transaction(
        pg_url, store.claim_items, job_id=job_id, item_ids=mine[:2], worker="w/1", lease_s=30, max_attempts=3
    )
    twin, _ = new_job(pg_url, 1)  # the same measurements through the transaction path
    run_transaction(pg_url, store.record_chunk, job_id=twin, measured=measured())
    run_transaction(pg_url, store.record_chunk, job_id=twin, measured=measured(hist={4: 2, 6: 1}))
    close_chunk(pg_url, job_id, measured=measured())
    sent.clear()
    closed = close_chunk(
        pg_url,
        job_id,
        finished=[(item, RESULT) for item in claimed],
        let_go=mine[2:],
        measured=measured(hist={4: 2, 6: 1}),
    )
    assert dict(sent) == {"WITH": 1}
    assert closed.finished == set(mine[:2]) and (closed.done, closed.failed, closed.total) == (2, 0, 4)
    assert not closed.may_have_ended  # two items still pending
    job, expected = job_row(pg_url, job_id), job_row(pg_url, twin)
    for name in (*store.postgres_chunk_ends.SUMS, *store.postgres_chunk_ends.HISTOGRAMS, "last_draft_tokens"):
        assert getattr(job, name) == getattr(expected, name), name
    assert job.gamma_hist == {"2": 3, "4": 3, "6": 1} and closed.gamma_hist == job.gamma_hist
    assert job.drafts_hist == {"0": 2, "2": 6, "4": 6, "6": 2} and closed.drafts_hist == job.drafts_hist
    # rounds by row count: seconds among them, summed as floats
    assert job.rounds_by_rows == {"3:rounds": 6, "3:seconds": 0.375, "3:plain_rounds": 2, "1:seconds": 0.125}
    assert (job.done, job.new_tokens, job.generate_seconds) == (2, 2, pytest.approx(0.2))
    with session_scope(pg_url) as session:
        rows = {
            i.id: (i.status, i.claimed_by) for i in session.scalars(select(Item).where(Item.job_id == job_id))
        }
        assert rows == {
            mine[0]: ("done", "w/1"),
            mine[1]: ("done", "w/1"),
            mine[2]: ("pending", None),
            mine[3]: ("pending", None),
        }
        outcomes = session.scalars(select(Attempt.outcome).where(Attempt.job_id == job_id)).all()
        assert outcomes == ["done", "done"]


def test_an_interrupted_close_ends_its_leases_now_and_a_stale_result_is_refused(pg_url: str) -> None:
    job_id, _ = new_job(pg_url, 3)
    mine = open_chunk(pg_url, job_id, (0, 3)).reserved
    claimed = run_transaction(
        pg_url, store.claim_items, job_id=job_id, item_ids=mine[:1], worker="w/1", lease_s=30, max_attempts=3
    )
    with session_scope(pg_url) as session:  # another worker took the item over: the fence moved on
        session.execute(update(Item).where(Item.id == mine[0]).values(fence=Item.fence + 1))
    closed = close_chunk(pg_url, job_id, finished=[(claimed[0], RESULT)], let_go=mine[1:], interrupted=True)
    assert closed.finished == set() and closed.done == 0
    with session_scope(pg_url) as session:
        for item_id in mine[1:]:
            item = session.get_one(Item, item_id)
            assert item.claimed_by == "w/1" and item.lease_expires_at <= utcnow()  # a sweeper takes them now
        assert session.scalars(select(Attempt.outcome).where(Attempt.job_id == job_id)).all() == [
            "superseded"
        ]


def test_the_close_whose_counters_add_up_ends_the_job(pg_url: str) -> None:
    job_id, _ = new_job(pg_url, 2)
    mine = open_chunk(pg_url, job_id, (0, 2)).reserved
    claimed = run_transaction(
        pg_url, store.claim_items, job_id=job_id, item_ids=mine, worker="w/1", lease_s=30, max_attempts=3
    )
    chunk = store.chunk_store(pg_url, job_id=job_id, holder="w/1", lease_s=30, max_attempts=3, retry_s=0)
    assert chunk.keeps_last_group
    closed = chunk.close(let_go=[], finished=[(claimed[0], RESULT)])
    assert closed is not None and closed.finished == {mine[0]} and job_row(pg_url, job_id).status == "running"
    closed = chunk.close(let_go=[], finished=[(claimed[1], RESULT)])
    job = job_row(pg_url, job_id)
    assert (
        closed is not None
        and closed.finished == {mine[1]}
        and job.status == "completed"
        and job.finished_at is not None
    )


def test_what_is_derived_is_written_only_from_the_newest_sums(pg_url: str) -> None:
    job_id, _ = new_job(pg_url, 1)
    first = close_chunk(pg_url, job_id, measured=measured(busy=0.5))
    second = close_chunk(pg_url, job_id, measured=measured(busy=0.25))
    assert run_statement(
        pg_url, store.record_derived, job_id=job_id, seen=second, values={"expected_speedup": 2.0}
    )
    assert not run_statement(
        pg_url, store.record_derived, job_id=job_id, seen=first, values={"expected_speedup": 1.0}
    )
    assert job_row(pg_url, job_id).expected_speedup == 2.0


def test_a_chunk_costs_one_statement_to_open_one_per_group_and_one_to_close(
    pg_url: str, scripted_models: None, sent: Counter[str]
) -> None:
    settings = Settings(database_url=pg_url, batch_size=16)
    job_id, _ = new_job(pg_url, 192)
    for start in (0, 64, 128):
        if start == 64:
            sent.clear()
        outcome = chunks.process_chunk(
            settings=settings, job_id=job_id, worker="w", seq_range=(start, start + 64)
        )
        if start == 64:
            assert outcome.done == 64
            # open, 4 groups (the last one's write goes with the close), close: no BEGIN, no COMMIT
            assert dict(sent) == {"WITH": 6}
    job = job_row(pg_url, job_id)
    assert (job.status, job.done, job.failed) == ("completed", 192, 0)
    with session_scope(pg_url) as session:
        assert session.scalar(text("SELECT count(*) FROM results WHERE job_id = :j"), {"j": job_id}) == 192


def test_a_close_that_fails_is_this_workers_fault_its_last_group_written_or_tried_again(
    pg_url: str, scripted_models: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close carries the last group's results: if it fails (not a lost database), the worker's
    fault path writes them, counts a try for what is left and ends its leases at once."""
    settings = Settings(database_url=pg_url, batch_size=16)
    job_id, _ = new_job(pg_url, 32)

    def broken(*_args, **_kwargs) -> None:
        raise RuntimeError("the close broke")

    monkeypatch.setattr(chunk_stores, "close_chunk", broken)
    with pytest.raises(chunks.WorkerFault, match="the close broke"):
        chunks.process_chunk(settings=settings, job_id=job_id, worker="w", seq_range=(0, 32))
    with session_scope(pg_url) as session:
        held = session.scalar(
            text("SELECT count(*) FROM items WHERE job_id = :j AND lease_expires_at > now()"), {"j": job_id}
        )
        done = session.scalar(
            text("SELECT count(*) FROM items WHERE job_id = :j AND status = 'done'"), {"j": job_id}
        )
    assert held == 0  # no lease left to run out
    assert done == 32  # the last group was written by the fault path


def test_one_thread_renews_every_chunk_of_a_process_and_none_after_its_stop(pg_url: str) -> None:
    settings = Settings(database_url=pg_url, lease_s=0.6)
    job_id, ids = new_job(pg_url, 4)
    for item_ids in (ids[:2], ids[2:]):
        run_statement(
            pg_url,
            store.open_chunk,
            job_id=job_id,
            holder="w/1",
            lease_s=0.6,
            max_attempts=3,
            item_ids=item_ids,
        )

    def leases() -> dict[int, object]:
        with session_scope(pg_url) as session:
            return dict(
                session.execute(select(Item.id, Item.lease_expires_at).where(Item.job_id == job_id)).all()
            )

    before = leases()
    threads = threading.active_count()
    with (
        chunks.PROCESS.renewer.holding(settings, item_ids=ids[:2], holder="w/1"),
        chunks.PROCESS.renewer.holding(settings, item_ids=ids[2:], holder="w/1") as second,
    ):
        assert threading.active_count() <= threads + 1
        wait_for(lambda: all(leases()[i] > before[i] for i in ids), timeout=10, what="both chunks renewed")
        renewed = leases()
        second.stop()
        stopped = leases()[ids[2]]
        # the first chunk's renewals go on ...
        wait_for(lambda: leases()[ids[0]] > renewed[ids[0]], timeout=10, what="the first chunk renewed again")
        assert leases()[ids[2]] == stopped  # ... the stopped one's do not
