"""`genjob api` and `genjob flower` refuse unsafe set-ups before they start anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import create_pg_database, drop_pg_database

from genjob.cli import main


def test_api_without_keys_refuses_a_public_address(embedded_env: str) -> None:
    result = CliRunner().invoke(main, ["api", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: refusing to listen on 0.0.0.0 without API keys: set GENJOB_API_KEYS "
        "(without keys the API is local-only, on 127.0.0.1)\n"
    )


def test_api_on_a_stale_database_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    blank = create_pg_database("genjob_api_blank")
    try:
        monkeypatch.setenv("GENJOB_DATABASE_URL", blank)
        result = CliRunner().invoke(main, ["api"])
        assert result.exit_code == 1
        assert "run `genjob db upgrade`" in result.output
    finally:
        drop_pg_database(blank)


def test_flower_needs_a_broker(embedded_env: str) -> None:
    result = CliRunner().invoke(main, ["flower"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: GENJOB_BROKER_URL is not set: Flower watches the workers of a broker\n",
    )


def test_flower_beyond_loopback_needs_authentication(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_BROKER_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.delenv("FLOWER_BASIC_AUTH", raising=False)
    monkeypatch.delenv("FLOWER_AUTH", raising=False)
    result = CliRunner().invoke(main, ["flower", "--address", "0.0.0.0"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: refusing to serve Flower on 0.0.0.0 without authentication: "
        "pass --basic-auth=user:password or set FLOWER_BASIC_AUTH\n"
    )
