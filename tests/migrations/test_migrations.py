"""Alembic migrates a blank Postgres database to head and back, and head matches the models."""

from __future__ import annotations

from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from genjob import db
from genjob.db import session_scope
from genjob.tables import Base, Job, utcnow


def test_upgrade_to_head_and_back(blank_pg_url: str) -> None:
    assert db.current_revision(blank_pg_url) is None
    db.upgrade(blank_pg_url)
    assert db.current_revision(blank_pg_url) == db.head_revision()
    inspector = inspect(db.get_engine(blank_pg_url))
    assert set(inspector.get_table_names()) == {
        "alembic_version",
        "jobs",
        "items",
        "results",
        "attempts",
        "idempotency_keys",
        "files",
        "file_chunks",
        "batches",
    }
    assert inspector.get_view_names() == ["job_stats"]
    unique = {tuple(u["column_names"]) for u in inspector.get_unique_constraints("results")}
    assert ("job_id", "item_id") in unique
    assert {fk["name"] for fk in inspector.get_foreign_keys("items")} == {"fk_items_job_id_jobs"}
    with db.get_engine(blank_pg_url).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"

    db.downgrade(blank_pg_url, "base")
    inspector = inspect(db.get_engine(blank_pg_url))
    assert inspector.get_table_names() == ["alembic_version"]
    assert inspector.get_view_names() == []
    assert db.current_revision(blank_pg_url) is None


def test_stale_schema_is_reported_not_changed(blank_pg_url: str) -> None:
    with pytest.raises(db.SchemaError, match="run `genjob db upgrade`"):
        db.ensure_schema(blank_pg_url, auto_upgrade=False)
    assert inspect(db.get_engine(blank_pg_url)).get_table_names() == []


def test_operator_view_columns_types_and_comments(blank_pg_url: str) -> None:
    """0005: jsonb, attempts.job_id with its index, a comment on every column, job_stats' new figures."""
    db.upgrade(blank_pg_url)
    engine = db.get_engine(blank_pg_url)
    inspector = inspect(engine)
    assert "ix_attempts_job_id" in {index["name"] for index in inspector.get_indexes("attempts")}
    with engine.connect() as connection:
        types = dict(
            connection.execute(
                text(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'jobs'"
                )
            ).all()
        )
        uncommented = connection.execute(
            text(
                """SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
                AND c.relname IN ('jobs', 'items', 'results', 'attempts', 'job_stats', 'idempotency_keys',
                                  'files', 'file_chunks', 'batches')
                AND col_description(c.oid, a.attnum) IS NULL"""
            )
        ).all()
    assert (types["spec"], types["gamma_hist"], types["costs"], types["versions"]) == ("jsonb",) * 4
    assert uncommented == []
    columns = {column["name"] for column in inspector.get_columns("job_stats")}
    assert {
        "expected_speedup",
        "elapsed_seconds",
        "elapsed_tokens_per_second",
        "tokens_per_second",
        "proposer_counts",  # 0011
    } <= columns


def test_job_stats_elapsed_throughput_and_lossless_only_when_greedy(blank_pg_url: str) -> None:
    db.upgrade(blank_pg_url)
    now = utcnow()
    with session_scope(blank_pg_url) as session:
        for job_id, temperature in (("greedy", 0.0), ("sampled", 0.8)):
            session.add(
                Job(
                    id=job_id,
                    status="completed",
                    model="m",
                    mode="draft",
                    queue="gpu",
                    spec={"temperature": temperature},
                    total=1,
                    done=1,
                    failed=0,
                    started_at=now - timedelta(seconds=10),
                    finished_at=now,
                    new_tokens=500,
                    generate_seconds=2.0,
                    lossless_checked=4,
                    lossless_matches=4,
                )
            )
    query = "SELECT job_id, tokens_per_second, elapsed_tokens_per_second, lossless_rate FROM job_stats"
    with db.get_engine(blank_pg_url).connect() as connection:
        rows = {row.job_id: row for row in connection.execute(text(query))}
    assert rows["greedy"].tokens_per_second == 250.0
    assert rows["greedy"].elapsed_tokens_per_second == pytest.approx(50.0)
    assert (rows["greedy"].lossless_rate, rows["sampled"].lossless_rate) == (1.0, None)


def test_downgrade_to_0003_and_up_again(blank_pg_url: str) -> None:
    db.upgrade(blank_pg_url)
    db.downgrade(blank_pg_url, "0003")
    assert "job_id" not in {c["name"] for c in inspect(db.get_engine(blank_pg_url)).get_columns("attempts")}
    db.upgrade(blank_pg_url)
    assert db.current_revision(blank_pg_url) == db.head_revision()
