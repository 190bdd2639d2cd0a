"""Full disks and bad broker URLs meet the CLI as one line, exit 1, never a traceback."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from genjob.cli import main


def test_stdin_spooled_onto_a_full_tmpdir_is_one_line(
    embedded_env: str, small_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (small_tmpfs / "filler").write_bytes(b"x" * 60_000)
    monkeypatch.setattr(tempfile, "tempdir", str(small_tmpfs))  # what TMPDIR sets
    lines = "".join(json.dumps({"prompt": "p" * 1000, "id": f"q{i}"}) + "\n" for i in range(1500))  # 1.5 MB
    result = CliRunner().invoke(main, ["submit", "-", "-m", "m", "--mode", "none"], input=lines)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"Error: -: cannot spool it in {small_tmpfs}: No space left on device (TMPDIR sets where)"
    ]
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["filler"]


def test_a_broker_url_with_an_unknown_transport_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_BROKER_URL", "notredis://x")
    result = CliRunner().invoke(main, ["jobs"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: invalid settings: GENJOB_BROKER_URL='notredis://x': unknown transport 'notredis' "
        "(redis://HOST:6379/0)\n",
    )
