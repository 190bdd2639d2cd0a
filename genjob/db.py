"""One SQLAlchemy engine per database URL, sessions, and Alembic upgrades.

Embedded mode (SQLite) migrates itself on first use; Postgres is migrated with ``genjob db upgrade``
(or the ``migrate`` service in compose) and a stale schema is reported, not silently changed.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import random
import re
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import CursorResult, Engine, Executable, create_engine, event, exc, inspect, text
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

# A dropped or refused connection, a server shutting down, a deadlock or SQLite's "database is locked".
RETRYABLE_DB_ERRORS = (exc.OperationalError, exc.InterfaceError)
MAX_RETRY_DELAY_S = 5.0

T = TypeVar("T")


class SchemaError(RuntimeError):
    """The database is not migrated to the code's schema."""


@lru_cache(maxsize=8)
def get_engine(url: str, ping: bool = True) -> Engine:
    """The engine for ``url``. ``ping``: test each pooled connection before use (a round trip per
    transaction); the workers' hot path goes without (``run_transaction(..., ping=False)``), since it
    retries a transaction whose connection turned out dead anyway."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=ping, pool_size=5, max_overflow=5)
    _ENGINES.add(engine)
    return engine


_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_inherited_connections() -> None:
    """In a forked child (a Celery pool process): new pools, never the parent's sockets or locks."""
    for engine in list(_ENGINES):
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_forget_inherited_connections)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


@lru_cache(maxsize=8)
def _session_factory(url: str, ping: bool = True) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url, ping), expire_on_commit=False)


def changed_rows(session: Session, statement: Executable) -> int:
    """Execute an UPDATE (or DELETE) and return how many rows it changed."""
    return cast("CursorResult[Any]", session.execute(statement)).rowcount


@contextmanager
def session_scope(url: str, *, ping: bool = True) -> Iterator[Session]:
    """A session in one transaction: committed on success, rolled back on any exception."""
    session = _session_factory(url, ping)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def run_transaction(
    url: str, fn: Callable[..., T], /, *, retry_s: float = 0.0, ping: bool = True, **kwargs: Any
) -> T:
    """``fn(session, **kwargs)`` in one transaction, retried with backoff on connection errors.

    A dropped connection (say ``pg_terminate_backend``), a restarting server or a lock timeout
    rolls the transaction back; it is run again after 0.05 s, 0.1 s, 0.2 s … (capped at 5 s,
    with jitter) for up to ``retry_s`` seconds, then the error is raised. ``fn`` must be safe to
    repeat, since a commit whose answer was lost is retried too: every write in ``genjob.store``
    is a conditional update that does nothing the second time. ``ping=False`` skips the pool's
    test of the connection (a round trip): a dead one fails the first statement and is retried.
    """

    def attempt() -> T:
        with session_scope(url, ping=ping) as session:
            return fn(session, **kwargs)

    return _retried(attempt, fn.__name__, retry_s)


def run_statement(url: str, fn: Callable[..., T], /, *, retry_s: float = 0.0, **kwargs: Any) -> T:
    """``fn(connection, **kwargs)`` on a pooled connection in autocommit (no pre-ping): each statement
    commits by itself, with no BEGIN or COMMIT round trip, so ``fn`` must be one statement (atomic
    alone) or statements that are each safe alone. Retried like ``run_transaction``."""

    def attempt() -> T:
        with get_engine(url, False).connect() as connection:
            return fn(connection.execution_options(isolation_level="AUTOCOMMIT"), **kwargs)

    return _retried(attempt, fn.__name__, retry_s)


def _retried(attempt: Callable[[], T], name: str, retry_s: float) -> T:
    deadline = time.monotonic() + retry_s
    delay = 0.05
    tries = 0
    while True:
        try:
            return attempt()
        except RETRYABLE_DB_ERRORS as error:
            tries += 1
            wait = delay * random.uniform(0.5, 1.5)
            if time.monotonic() + wait > deadline:
                raise
            reason = str(error.orig or error).strip().splitlines()[0]
            log.warning("database error in %s (%s): retry %d in %.2f s", name, reason, tries, wait)
            time.sleep(wait)
            delay = min(delay * 2, MAX_RETRY_DELAY_S)


def migrations_dir() -> Path:
    """The Alembic scripts, shipped inside the package (``genjob.migrations``), wherever it is installed."""
    return Path(str(importlib.resources.files("genjob.migrations")))


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with get_engine(url).connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert head is not None
    return head


REVISION_LINE = re.compile(r"^(down_revision|revision)\b[^=\n]*=\s*(None|\"(\w+)\"|'(\w+)')\s*$", re.M)


@lru_cache(maxsize=1)
def quick_head_revision() -> str | None:
    """The head revision read from the migration scripts' ``revision`` and ``down_revision`` lines,
    without importing Alembic (a fifth of a second): None unless every script names one revision and
    one parent (or None) and exactly one revision is nobody's parent; then Alembic decides."""
    revisions, parents = set(), set()
    for script in migrations_dir().joinpath("versions").glob("*.py"):
        if script.name == "__init__.py":
            continue
        matches = list(REVISION_LINE.finditer(script.read_text(encoding="utf-8")))
        lines = {match.group(1): match.group(3) or match.group(4) for match in matches}
        if len(matches) != 2 or set(lines) != {"revision", "down_revision"} or not lines["revision"]:
            return None
        revisions.add(lines["revision"])
        if lines["down_revision"]:
            parents.add(lines["down_revision"])
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 else None


def _stored_revision(url: str) -> str | None:
    """The one revision in the database's ``alembic_version`` table, read with plain SQL; None when
    there is no such table, or not exactly one row."""
    try:
        with get_engine(url).connect() as connection:
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except exc.DBAPIError:
        return None
    return rows[0] if len(rows) == 1 else None


def prepare_schema(url: str) -> None:
    """Embedded SQLite migrates itself; any other database must already be at head."""
    ensure_schema(url, auto_upgrade=url.startswith("sqlite"))


def ensure_schema(url: str, *, auto_upgrade: bool) -> None:
    """Check the schema is at head; upgrade it when ``auto_upgrade`` (embedded SQLite).

    A database at head is told with one SELECT and the scripts' text (``quick_head_revision``), so a
    command such as ``genjob status`` does not wait for Alembic to load; anything else goes to Alembic."""
    head = quick_head_revision()
    if head is not None and _stored_revision(url) == head:
        return
    current = current_revision(url)
    if current == head_revision():
        return
    if auto_upgrade:
        upgrade(url)
        return
    if current is None and not inspect(get_engine(url)).get_table_names():
        state = "the database is empty (no tables)"
    else:
        state = f"the database is at revision {current or 'base'}"
    raise SchemaError(f"{state}, not at {head_revision()}: run `genjob db upgrade`")
