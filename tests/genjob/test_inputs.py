"""Bad prompt files: each gives a clear error naming the line (and field), and stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_jsonl
from sqlalchemy import func, select

from genjob.cli import main
from genjob.db import session_scope
from genjob.inputs import InputFileError, InputLimits, iter_prompt_file, validate_prompt_file
from genjob.models import Item, Job

GOOD = json.dumps({"prompt": "def f():"})


def counts(url: str) -> tuple[int, int]:
    with session_scope(url) as session:
        return session.scalar(select(func.count()).select_from(Job)), session.scalar(
            select(func.count()).select_from(Item)
        )


@pytest.fixture
def pg_env(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GENJOB_DATABASE_URL", pg_url)
    return pg_url


CASES = [
    (
        "malformed_json",
        [GOOD, '{"prompt": "x"'],
        "p.jsonl:2: invalid JSON: Expecting ',' delimiter (column 15)",
    ),
    ("missing_prompt", [GOOD, GOOD, '{"id": "x"}'], "p.jsonl:3: missing required field 'prompt'"),
    (
        "empty_prompt",
        ['{"prompt": ""}'],
        "p.jsonl:1: field 'prompt': String should have at least 1 character",
    ),
    ("blank_prompt", ['{"prompt": "   "}'], "p.jsonl:1: field 'prompt': must not be blank"),
    ("non_string_prompt", ['{"prompt": 42}'], "p.jsonl:1: field 'prompt': Input should be a valid string"),
    (
        "duplicate_id",
        ['{"prompt": "a", "id": "x"}', '{"prompt": "b", "id": "y"}', '{"prompt": "c", "id": "x"}'],
        "p.jsonl:3: field 'id': duplicate id 'x'",
    ),
    ("not_an_object", ['["prompt"]'], "p.jsonl:1: expected a JSON object, got array"),
    (
        "unknown_field",
        ['{"prompt": "a", "max_tokens": 3}'],
        "p.jsonl:1: unknown field 'max_tokens' (allowed: prompt, id, max_new_tokens)",
    ),
    (
        "max_new_tokens_zero",
        ['{"prompt": "a", "max_new_tokens": 0}'],
        "p.jsonl:1: field 'max_new_tokens': must be between 1 and 8192, got 0",
    ),
    (
        "max_new_tokens_not_int",
        ['{"prompt": "a", "max_new_tokens": "5"}'],
        "p.jsonl:1: field 'max_new_tokens': Input should be a valid integer",
    ),
]


@pytest.mark.parametrize(("lines", "expected"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_line_fails_submit_with_line_number_and_writes_nothing(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "p.jsonl", lines)
    before = counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == f"Error: {expected}\n"
    assert counts(pg_env) == before


def test_empty_file(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_bytes(b"\n  \n")
    before = counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl: no prompts found (the file is empty or has only blank lines)\n"
    assert counts(pg_env) == before


def test_non_utf8_bytes(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_bytes(GOOD.encode() + b'\n{"prompt": "caf\xe9"}\n')
    before = counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:2: not valid UTF-8 (byte 0xe9 at offset 15)\n"
    assert counts(pg_env) == before


def test_ten_megabyte_line(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    huge = json.dumps({"prompt": "x" * (10 << 20)})
    write_jsonl(tmp_path / "p.jsonl", [GOOD, huge, GOOD])
    before = counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:2: line is longer than the limit of 1048576 bytes\n"
    assert counts(pg_env) == before


def test_all_errors_reported_up_to_a_limit(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", ["{"] * 25)
    with pytest.raises(InputFileError) as info:
        validate_prompt_file(path, limits=InputLimits())
    assert len(info.value.errors) == 20
    assert str(info.value).splitlines()[-1] == "… and 5 more errors"


def test_bom_crlf_blank_lines_and_missing_final_newline_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a", "id": "1"}\r\n\r\n{"prompt": "b", "max_new_tokens": 3}')
    assert validate_prompt_file(path, limits=InputLimits()) == 2
    items = list(iter_prompt_file(path, limits=InputLimits()))
    assert [(i.seq, i.line, i.prompt, i.custom_id, i.max_new_tokens) for i in items] == [
        (0, 1, "a", "1", None),
        (1, 3, "b", None, 3),
    ]
