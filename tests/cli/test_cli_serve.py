"""`genjob api` and `genjob flower` refuse unsafe set-ups before they start anything."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
from click.testing import CliRunner

from genjob.cli import main
from tests.support.processes import GENJOB


def test_api_without_keys_refuses_a_public_address(embedded_env: str) -> None:
    result = CliRunner().invoke(main, ["api", "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert result.output == (
        "Error: refusing to listen on 0.0.0.0 without API keys: set GENJOB_API_KEYS "
        "(without keys the API is local-only, on 127.0.0.1)\n"
    )


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "so-reuseport"])
def test_api_refuses_a_port_in_use(embedded_env: str, reuse_port: bool) -> None:
    """Another server on the port (a plain one, or one that binds with SO_REUSEPORT as Granian does
    and would share it): `genjob api` stops at once with one line, rather than split the requests."""
    with socket.socket() as taken:
        if reuse_port:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [GENJOB, "api", "--port", str(port)],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"Error: cannot listen on 127.0.0.1:{port}: the port is in use (another server listens there)\n",
    )
    assert took < 30  # at once: no retries to bind (10 s of imports on a busy 2-core machine, not 60)


def test_api_on_a_stale_database_says_so(blank_pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_DATABASE_URL", blank_pg_url)
    result = CliRunner().invoke(main, ["api"])
    assert result.exit_code == 1
    assert "run `genjob db upgrade`" in result.output


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
