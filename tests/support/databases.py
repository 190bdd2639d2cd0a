"""Throwaway Postgres databases and Redis queues: of a test session, a test or a benchmark of its own.

``GENJOB_TEST_PG_ADMIN_URL`` (the database the throwaway ones are made from) and ``GENJOB_TEST_REDIS_URL``
say where the servers are; the defaults are the ones scripts/services.sh starts.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from sqlalchemy import create_engine, text

from genjob import db
from genjob.queueing import queue_keys
from genjob.worker.sweeper import broker_mark_key

PG_ADMIN_URL = os.environ.get(
    "GENJOB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GENJOB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _admin(statement: str) -> None:
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(statement))
    finally:
        admin.dispose()


def create_pg_database(prefix: str = "genjob_test") -> str:
    """A new, blank database named ``prefix_<random>``; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    _admin(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def drop_pg_database(url: str) -> None:
    """Drop the database at ``url``, its connections cut (this process's pools closed first)."""
    db.get_engine(url).dispose()
    db.get_engine(url, False).dispose()
    db.get_engine.cache_clear()
    db._session_factory.cache_clear()
    name = url.split("?", 1)[0].rsplit("/", 1)[1]
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def pg_database(prefix: str = "genjob_test", *, migrated: bool = True) -> Iterator[str]:
    """A database of the block's own (migrated to head unless ``migrated=False``), dropped after it."""
    url = create_pg_database(prefix)
    try:
        if migrated:
            db.upgrade(url)
        yield url
    finally:
        drop_pg_database(url)


def delete_queue(name: str, broker_url: str = REDIS_URL) -> None:
    """A queue and its priority lists (kombu keeps levels 3, 6, 9 in ``name␆␖N``)."""
    redis.Redis.from_url(broker_url).delete(*queue_keys(name))


@contextmanager
def throwaway_queue(prefix: str = "gpu-test", broker_url: str = REDIS_URL) -> Iterator[str]:
    """A queue name of the block's own; whatever is left in the queue is deleted after it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        delete_queue(name, broker_url)


def broker_marked(broker_url: str, database_url: str) -> bool:
    """Whether a sweeper has marked the broker for this database (it has seen the broker lose nothing)."""
    return bool(redis.Redis.from_url(broker_url).exists(broker_mark_key(database_url)))
