"""Alembic migrates a blank Postgres database to head and back, and head matches the models."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import create_pg_database, drop_pg_database
from sqlalchemy import inspect

from genjob import db
from genjob.tables import Base


@pytest.fixture
def blank_pg() -> Iterator[str]:
    url = create_pg_database("genjob_migrate")
    yield url
    drop_pg_database(url)


def test_upgrade_to_head_and_back(blank_pg: str) -> None:
    assert db.current_revision(blank_pg) is None
    db.upgrade(blank_pg)
    assert db.current_revision(blank_pg) == db.head_revision()
    inspector = inspect(db.get_engine(blank_pg))
    assert set(inspector.get_table_names()) == {"alembic_version", "jobs", "items", "results", "attempts"}
    assert inspector.get_view_names() == ["job_stats"]
    unique = {tuple(u["column_names"]) for u in inspector.get_unique_constraints("results")}
    assert ("job_id", "item_id") in unique
    assert {fk["name"] for fk in inspector.get_foreign_keys("items")} == {"fk_items_job_id_jobs"}
    with db.get_engine(blank_pg).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"

    db.downgrade(blank_pg, "base")
    inspector = inspect(db.get_engine(blank_pg))
    assert inspector.get_table_names() == ["alembic_version"]
    assert inspector.get_view_names() == []
    assert db.current_revision(blank_pg) is None


def test_stale_schema_is_reported_not_changed(blank_pg: str) -> None:
    with pytest.raises(db.SchemaError, match="run `genjob db upgrade`"):
        db.ensure_schema(blank_pg, auto_upgrade=False)
    assert inspect(db.get_engine(blank_pg)).get_table_names() == []
