"""The sweeper: its broker marker (one key per database, however its URL is spelled), and a sweep."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
import redis
from sqlalchemy import update

from genjob import db, store
from genjob.constants import BROKER_MARK_KEY
from genjob.db import session_scope
from genjob.formats.reader import PromptItem
from genjob.options import JobSpec
from genjob.queueing import queue_depths
from genjob.settings import Settings
from genjob.tables import Item, Job, utcnow
from genjob.worker.celery_app import create_app
from genjob.worker.sweeper import Sweeper, SweepReport, broker_mark_key
from tests.support.databases import REDIS_URL


def test_marker_key_names_the_database_not_the_url_spelling() -> None:
    spellings = [
        "postgresql+psycopg://postgres@127.0.0.1:5432/genjob",
        "postgresql://postgres:secret@127.0.0.1:5432/genjob",
        "postgresql+psycopg://worker@127.0.0.1:5432/genjob?application_name=gpu-1&sslmode=disable",
    ]
    keys = {broker_mark_key(url) for url in spellings}
    assert len(keys) == 1
    assert keys.pop().startswith(f"{BROKER_MARK_KEY}:")


def test_marker_key_differs_between_databases() -> None:
    keys = {
        broker_mark_key("postgresql+psycopg://postgres@127.0.0.1:5432/genjob"),
        broker_mark_key("postgresql+psycopg://postgres@127.0.0.1:5432/genjob_staging"),
        broker_mark_key("postgresql+psycopg://postgres@10.0.0.2:5432/genjob"),
        broker_mark_key("sqlite:///genjob.db"),
    }
    assert len(keys) == 4


def test_a_sweep_on_a_fresh_database_and_broker_says_nothing_and_finishes_what_it_must(
    blank_pg_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The first sweep on a fresh database sets the marker without a word (there is nothing to queue
    again); later sweeps finish the queueing of a job whose submit stopped, and end a job whose items
    are all final."""
    url = blank_pg_url
    broker = redis.Redis.from_url(REDIS_URL)
    try:
        db.upgrade(url)
        settings = Settings(database_url=url, broker_url=REDIS_URL, queue=queue_name, chunk_size=4, lease_s=5)
        sweeper = Sweeper(create_app(settings))
        with caplog.at_level(logging.INFO, logger="genjob"):
            assert sweeper.sweep() == SweepReport()
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        assert broker.exists(broker_mark_key(url))

        with session_scope(url) as session:
            items = [PromptItem(i, i + 1, f"p{i}", None, None) for i in range(10)]
            stalled = store.create_job(
                session, spec=JobSpec(model="m", mode="none"), items=items, queue=queue_name
            )
            stalled.queue_progress_at = utcnow() - timedelta(minutes=1)  # its submit died a minute ago
            settled = store.create_job(
                session, spec=JobSpec(model="m", mode="none"), items=items[:2], queue=queue_name
            )
            settled.status, settled.queued_seq = "running", 2
            session.flush()
            session.execute(update(Item).where(Item.job_id == settled.id).values(status="done"))
            settled.done = 2
        report = sweeper.sweep()
        assert (report.finished_queueing, report.ended_jobs) == (3, 1)
        assert queue_depths(REDIS_URL, [queue_name])[queue_name] == 3
        with session_scope(url) as session:
            assert session.get(Job, stalled.id).queued_seq == 10
            assert session.get(Job, settled.id).status == "completed"
        assert sweeper.sweep() == SweepReport()  # nothing left to do
    finally:
        broker.delete(broker_mark_key(url))


def test_a_sweep_counts_lost_items_retried_and_exhausted_ones_failed_by_model(
    blank_pg_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    from prometheus_client import REGISTRY

    from genjob.worker.leasing import worker_name

    url = blank_pg_url
    db.upgrade(url)
    settings = Settings(database_url=url, broker_url=REDIS_URL, queue=queue_name, max_attempts=3)
    sweeper = Sweeper(create_app(settings))
    try:
        sweeper.sweep()
        with session_scope(url) as session:
            items = [PromptItem(i, i + 1, f"p{i}", None, None) for i in range(6)]
            job = store.create_job(
                session, spec=JobSpec(model="m-swept", mode="none"), items=items, queue=queue_name
            )
            job.status, job.queued_seq = "running", 6
            session.flush()
            lapsed = utcnow() - timedelta(seconds=1)
            session.execute(
                update(Item)
                .where(Item.job_id == job.id)
                .values(status="running", claimed_by="dead/1", lease_expires_at=lapsed, attempts=1)
            )
            session.execute(update(Item).where(Item.job_id == job.id, Item.seq < 2).values(attempts=3))
            # handed back by a stopping worker: pending, its lease ended on purpose
            session.execute(update(Item).where(Item.job_id == job.id, Item.seq == 5).values(status="pending"))
        labels = {"model": "m-swept", "queue": queue_name, "mode": "none", "worker": worker_name()}
        with caplog.at_level(logging.WARNING, logger="genjob"):
            assert sweeper.sweep().reclaimed_items == 4
        assert (
            f"job {job.id}: 3 items lost with their worker (leases ran out unrenewed) and 1 item handed "
            "back by a stopping or failing worker, queued again" in caplog.messages
        )
        assert REGISTRY.get_sample_value("genjob_items_total", {**labels, "state": "retried"}) == 4
        assert REGISTRY.get_sample_value("genjob_items_total", {**labels, "state": "failed"}) == 2
    finally:
        redis.Redis.from_url(REDIS_URL).delete(broker_mark_key(url))
