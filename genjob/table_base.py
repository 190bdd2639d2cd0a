"""The tables' shared declarations: the declarative base and its naming convention, the column types
that differ between Postgres and SQLite, the clock. ``genjob.tables`` and ``genjob.file_tables``
declare the tables on it. Must not know: torch, Celery, the HTTP API or the CLI.
"""

from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, Integer, MetaData
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY, not BIGINT.
BigId = BigInteger().with_variant(Integer, "sqlite")
# jsonb on Postgres (indexable, comparable); JSON text on SQLite.
Json = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


# Who owns jobs submitted straight to the database by the CLI (API keys' owners are ``key-…``).
LOCAL_OWNER = "local"
