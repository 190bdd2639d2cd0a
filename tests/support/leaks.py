"""Planted passwords for the tests that grep every output for them (tests/*/test_no_leaks.py)."""

from __future__ import annotations

from tests.support.processes import free_port

BROKER_SECRET = "Br0kerS3cret"
DATABASE_SECRET = "DbS3cretPw"


def planted_database_url(pg_url: str) -> str:
    """``pg_url`` with a password (the test server trusts loopback: any password connects)."""
    return pg_url.replace("postgres@", f"postgres:{DATABASE_SECRET}@", 1)


def dead_broker_url() -> str:
    return f"redis://genjob:{BROKER_SECRET}@127.0.0.1:{free_port()}/0"


def assert_no_secret(text: str) -> None:
    assert BROKER_SECRET not in text
    assert DATABASE_SECRET not in text
