"""Nasty prompt files, each class through the CLI and the API: a one-line reason with the line, exit 1 or
422, and nothing stored. Special files (pipes, devices, stdin) are the CLI's: the API gets uploads."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from genjob.cli import main
from genjob.db import session_scope
from genjob.formats import sources
from genjob.settings import Settings
from genjob.tables import Job
from tests.support.api import AUTH
from tests.support.jobs import stored_counts
from tests.support.processes import GENJOB, service_env

DEEP = 30_000  # far past Python's recursion limit, within the tests' 64 KiB upload limit


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


NESTED = "p.jsonl:1: invalid JSON: arrays or objects nested deeper than 64 levels"
CASES = [
    ("blank_id", '{"prompt": "a", "id": "   "}', "genjob", "p.jsonl:1: field 'id': must not be blank"),
    (
        "blank_custom_id",
        '{"custom_id": " ", "body": {"prompt": "a"}}',
        "openai",
        "p.jsonl:1: field 'custom_id': must not be blank",
    ),
    (
        "duplicate_key",
        '{"prompt": "a", "prompt": "b"}',
        "genjob",
        "p.jsonl:1: invalid JSON: duplicate key 'prompt' (only one value may be given)",
    ),
    (
        "duplicate_nested_key",
        '{"custom_id": "r", "body": {"prompt": "a", "max_tokens": 3, "max_tokens": 9}}',
        "openai",
        "p.jsonl:1: invalid JSON: duplicate key 'max_tokens' (only one value may be given)",
    ),
    ("nested_line", nested(DEEP), "genjob", NESTED),
    ("nested_field", '{"prompt": "a", "id": ' + nested(DEEP) + "}", "genjob", NESTED),
    (
        "nested_messages",
        '{"custom_id": "r", "body": {"messages": [{"role": "user", "content": ' + nested(DEEP) + "}]}}",
        "openai",
        NESTED,
    ),
    (
        "huge_integer",
        '{"prompt": "a", "max_new_tokens": ' + "9" * 5000 + "}",
        "genjob",
        "p.jsonl:1: invalid JSON: a number of 5000 digits (at most 100)",
    ),
    (
        "nan",
        '{"prompt": "a", "max_new_tokens": NaN}',
        "genjob",
        "p.jsonl:1: invalid JSON: NaN is not a JSON value",
    ),
    (
        "utf32_le",
        '{"prompt": "a"}'.encode("utf-32"),
        "genjob",
        "p.jsonl:1: the file is UTF-32 (byte order mark ff fe 00 00); save it as UTF-8",
    ),
    (
        "utf32_be",
        b"\x00\x00\xfe\xff" + '{"prompt": "a"}'.encode("utf-32-be"),
        "genjob",
        "p.jsonl:1: the file is UTF-32 (byte order mark 00 00 fe ff); save it as UTF-8",
    ),
    (
        "utf16_without_bom",
        '{"prompt": "a"}\n'.encode("utf-16-le"),
        "genjob",
        "p.jsonl:1: NUL bytes: the file looks like UTF-16 or UTF-32 without a byte order mark, or binary "
        "data; save it as UTF-8",
    ),
]


@pytest.fixture
def cli_env(broker_env: Settings, tmp_path: Path) -> Path:
    """The CLI's settings on the session's Postgres, in ``tmp_path`` (returned)."""
    return tmp_path


@pytest.mark.parametrize(("content", "fmt", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_by_the_cli_and_the_api_storing_nothing(
    client: TestClient, pg_url: str, cli_env: Path, content: str | bytes, fmt: str, expected: str
) -> None:
    data = content if isinstance(content, bytes) else (content + "\n").encode()
    (cli_env / "p.jsonl").write_bytes(data)
    before = stored_counts(pg_url)

    result = CliRunner().invoke(
        main, ["submit", "p.jsonl", "-m", "m", "--mode", "none", "--input-format", fmt]
    )
    assert (result.exit_code, result.output) == (1, f"Error: {expected}\n")
    assert stored_counts(pg_url) == before

    response = client.post(
        "/v1/jobs", params={"model": "tiny", "input_format": fmt}, files={"file": ("p.jsonl", data)}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"
    assert response.json()["error"]["message"] == f"{expected}; nothing was stored"
    assert stored_counts(pg_url) == before


def test_a_named_pipe_nobody_writes_to_is_refused_without_hanging(
    pg_url: str, cli_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(cli_env / "p.fifo")
    monkeypatch.setattr(sources, "PIPE_WAIT_S", 0.2)
    before = stored_counts(pg_url)
    result = CliRunner().invoke(main, ["submit", "p.fifo", "-m", "m", "--mode", "none"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: p.fifo: a named pipe that nothing wrote to within 0.2 s: start its writer first, or pass a "
        "regular file\n",
    )
    assert stored_counts(pg_url) == before


def test_a_named_pipe_with_a_writer_is_read_once(pg_url: str, cli_env: Path) -> None:
    fifo = cli_env / "p.fifo"
    os.mkfifo(fifo)
    lines = b'{"prompt": "a"}\n{"prompt": "b"}\n'
    writer = threading.Thread(target=fifo.write_bytes, args=(lines,))
    writer.start()
    result = CliRunner().invoke(main, ["submit", "p.fifo", "-m", "m", "--mode", "none"])
    writer.join(timeout=10)
    assert result.exit_code == 0, result.output
    with session_scope(pg_url) as session:
        assert session.get(Job, result.stdout.strip()).total == 2
    assert CliRunner().invoke(main, ["cancel", result.stdout.strip()]).exit_code == 0


def test_standard_input_as_dash(pg_url: str, cli_env: Path) -> None:
    result = CliRunner().invoke(main, ["submit", "-", "-m", "m", "--mode", "none"], input='{"prompt": "a"}\n')
    assert result.exit_code == 0, result.output
    with session_scope(pg_url) as session:
        assert session.get(Job, result.stdout.strip()).total == 1
    assert CliRunner().invoke(main, ["cancel", result.stdout.strip()]).exit_code == 0


def test_a_device_is_refused(pg_url: str, cli_env: Path) -> None:
    before = stored_counts(pg_url)
    result = CliRunner().invoke(main, ["submit", "/dev/null", "-m", "m", "--mode", "none"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: /dev/null: a character device (a terminal?): pass a regular file, a pipe, or - for standard "
        "input\n",
    )
    assert stored_counts(pg_url) == before


def test_dev_stdin_and_process_substitution_work(pg_url: str, queue_name: str, tmp_path: Path) -> None:
    """The shell's ways of passing a stream: /dev/stdin from a pipe, and <(…) (a /dev/fd pipe)."""
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "a"}) + "\n")
    env = service_env(pg_url, queue_name)
    submit = f"{GENJOB} submit {{}} -m m --mode none"
    for command in (f"cat p.jsonl | {submit.format('/dev/stdin')}", submit.format("<(cat p.jsonl)")):
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        with session_scope(pg_url) as session:
            assert session.get(Job, done.stdout.strip()).total == 1


def test_escape_sequences_reach_the_terminal_escaped(pg_url: str, cli_env: Path) -> None:
    (cli_env / "p.jsonl").write_text('{"prompt": "a", "\\u001b[2J": 1}\n')
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--mode", "none"])
    assert (result.exit_code, result.output) == (
        1,
        "Error: p.jsonl:1: unknown field '\\x1b[2J' (allowed: prompt, id, max_new_tokens)\n",
    )


def test_api_upload_names_are_escaped_in_json(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny"},
        files={"file": ("p\x1b[31m.jsonl", b'{"prompt": ""}\n')},
        headers=AUTH,
    )
    assert response.status_code == 422
    assert "\\u001b" in response.text  # JSON escapes it: no raw escape byte in the body
