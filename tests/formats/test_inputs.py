"""Bad prompt files: each gives a clear error naming the line (and field), and stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from genjob.cli import main
from genjob.db import session_scope
from genjob.formats.lines import InputFileError, InputLimits
from genjob.formats.reader import LineChecks, check_prompts
from genjob.tables import Item
from tests.support.databases import REDIS_URL
from tests.support.jobs import stored_counts
from tests.support.prompts import iter_prompt_file, validate_prompt_file, write_jsonl

GOOD = json.dumps({"prompt": "def f():"})


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
    ("string_not_object", [GOOD, '"just a prompt"'], "p.jsonl:2: expected a JSON object, got string"),
    ("number_not_object", ["42"], "p.jsonl:1: expected a JSON object, got number"),
    ("null_not_object", ["null"], "p.jsonl:1: expected a JSON object, got null"),
    (
        "max_new_tokens_negative",
        ['{"prompt": "a", "max_new_tokens": -3}'],
        "p.jsonl:1: field 'max_new_tokens': must be between 1 and 8192, got -3",
    ),
    (
        "max_new_tokens_huge",
        ['{"prompt": "a", "max_new_tokens": 1000000000000000000000000000000}'],
        "p.jsonl:1: field 'max_new_tokens': must be between 1 and 8192, got 1000000000000000000000000000000",
    ),
    (
        "max_new_tokens_float",
        ['{"prompt": "a", "max_new_tokens": 5.0}'],
        "p.jsonl:1: field 'max_new_tokens': Input should be a valid integer",
    ),
    (
        "max_new_tokens_bool",
        ['{"prompt": "a", "max_new_tokens": true}'],
        "p.jsonl:1: field 'max_new_tokens': Input should be a valid integer",
    ),
    (
        "lone_surrogate_in_prompt",
        ['{"prompt": "a\\ud800"}'],
        "p.jsonl:1: field 'prompt': Input should be a valid string, unable to parse raw data as a unicode "
        "string",
    ),
    (
        "bom_not_on_the_first_line",
        [GOOD, "\ufeff" + GOOD],
        "p.jsonl:2: invalid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)",
    ),
]


@pytest.mark.parametrize(("lines", "expected"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_line_fails_submit_with_line_number_and_writes_nothing(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "p.jsonl", lines)
    before = stored_counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == f"Error: {expected}\n"
    assert stored_counts(pg_env) == before


def test_empty_file(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_bytes(b"\n  \n")
    before = stored_counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl: no prompts found (the file is empty or has only blank lines)\n"
    assert stored_counts(pg_env) == before


def test_non_utf8_bytes(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_bytes(GOOD.encode() + b'\n{"prompt": "caf\xe9"}\n')
    before = stored_counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:2: not valid UTF-8 (byte 0xe9 at offset 15)\n"
    assert stored_counts(pg_env) == before


def test_ten_megabyte_line(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    huge = json.dumps({"prompt": "x" * (10 << 20)})
    write_jsonl(tmp_path / "p.jsonl", [GOOD, huge, GOOD])
    before = stored_counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:2: line is longer than the limit of 1048576 bytes\n"
    assert stored_counts(pg_env) == before


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


def submit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str):
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none", *args])


def test_truncated_last_line_says_so(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p.jsonl").write_bytes(f'{GOOD}\n{GOOD}\n{{"prompt": "def g('.encode())
    before = stored_counts(pg_env)
    result = submit_file(tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert result.output == (
        "Error: p.jsonl:3: invalid JSON: Unterminated string starting at (column 12); "
        "the file ends in the middle of this line (truncated?)\n"
    )
    assert stored_counts(pg_env) == before


def test_utf16_file(pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "p.jsonl").write_bytes((GOOD + "\n" + GOOD + "\n").encode("utf-16"))
    before = stored_counts(pg_env)
    result = submit_file(tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert result.output == "Error: p.jsonl:1: the file is UTF-16 (byte order mark ff fe); save it as UTF-8\n"
    assert stored_counts(pg_env) == before


def test_a_one_gigabyte_file_is_refused_before_reading_it(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with (tmp_path / "p.jsonl").open("wb") as sparse:  # 1 GiB on paper, nothing on disk
        sparse.write(GOOD.encode() + b"\n")
        sparse.truncate(1 << 30)
    before = stored_counts(pg_env)
    result = submit_file(tmp_path, monkeypatch)
    assert result.exit_code == 1
    assert result.output == (
        "Error: p.jsonl: the file is 1073741824 bytes, over the limit of 536870912 bytes "
        "(GENJOB_MAX_UPLOAD_BYTES)\n"
    )
    assert stored_counts(pg_env) == before


def test_a_stream_over_the_size_limit_stops_there(tmp_path: Path) -> None:
    """Streams (HTTP uploads) have no size up front: the limit is counted while reading."""
    import io

    data = (GOOD + "\n").encode() * 200
    with pytest.raises(InputFileError) as info:
        check_prompts(io.BytesIO(data), LineChecks(InputLimits(max_file_bytes=1024)), source="upload")
    assert str(info.value) == (
        "upload: the file is larger than that, over the limit of 1024 bytes (GENJOB_MAX_UPLOAD_BYTES)"
    )


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("0", "Error: invalid job options: max_new_tokens must be between 1 and 8192, got 0\n"),
        ("-5", "Error: invalid job options: max_new_tokens must be between 1 and 8192, got -5\n"),
        ("100000", "Error: invalid job options: max_new_tokens must be between 1 and 8192, got 100000\n"),
    ],
)
def test_max_new_tokens_option_out_of_range(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, option: str, expected: str
) -> None:
    write_jsonl(tmp_path / "p.jsonl", [GOOD])
    before = stored_counts(pg_env)
    result = submit_file(tmp_path, monkeypatch, "--max-new-tokens", option)
    assert (result.exit_code, result.output) == (1, expected)
    assert stored_counts(pg_env) == before


def test_prompt_longer_than_a_local_models_context_is_refused_at_submit(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_pair: tuple[Path, Path]
) -> None:
    target = tiny_pair[0]  # n_positions 512, a tokenizer.json next to its config.json
    lines = [
        GOOD,
        json.dumps({"prompt": "def f(): pass\n" * 200}),
        json.dumps({"prompt": "x", "max_new_tokens": 600}),
    ]
    write_jsonl(tmp_path / "p.jsonl", lines)
    before = stored_counts(pg_env)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", str(target), "--max-new-tokens", "16"])
    assert result.exit_code == 1
    errors = result.output.removeprefix("Error: ").splitlines()
    assert errors[0].startswith("p.jsonl:2: field 'prompt': ")
    assert errors[0].endswith(
        f"tokens + max_new_tokens 16 exceeds the model's context of 512 tokens (model {target})"
    )
    assert errors[1] == (
        f"p.jsonl:3: field 'prompt': prompt of 1 tokens + max_new_tokens 600 exceeds the model's context "
        f"of 512 tokens (model {target})"
    )
    assert stored_counts(pg_env) == before


def test_bom_crlf_and_blank_lines_are_stored_clean(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, queue_name: str
) -> None:
    monkeypatch.setenv("GENJOB_BROKER_URL", REDIS_URL)  # store and queue only: nothing runs
    monkeypatch.setenv("GENJOB_QUEUE", queue_name)
    (tmp_path / "p.jsonl").write_bytes(
        b'\xef\xbb\xbf\r\n{"prompt": "a\\r\\nb", "id": "x"}\r\n\r\n{"prompt": "c"}'
    )
    result = submit_file(tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    with session_scope(pg_env) as session:
        items = session.scalars(
            select(Item).where(Item.job_id == result.output.strip()).order_by(Item.seq)
        ).all()
        assert [(i.seq, i.line, i.custom_id, i.prompt) for i in items] == [
            (0, 2, "x", "a\r\nb"),
            (1, 4, None, "c"),
        ]
    assert CliRunner().invoke(main, ["cancel", result.output.strip()]).exit_code == 0  # leave nothing open


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (
            '{"prompt": "x", "prompt": "y"}',
            "invalid JSON: duplicate key 'prompt' (only one value may be given)",
        ),
        ('{"prompt": "x", "id": "line-7"}', "field 'id': duplicate id 'line-7'"),
    ],
    ids=["duplicate_key", "duplicate_id"],
)
def test_a_bad_line_deep_in_a_large_file_rolls_back_the_copy_under_way(
    pg_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str, expected: str
) -> None:
    """The file is read once into the COPY: lines before the bad one were already sent to Postgres."""
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps({"prompt": f"prompt {i}: " + "x" * 200, "id": f"line-{i}"}) for i in range(30_000)]
    lines.insert(25_000, bad)
    write_jsonl(tmp_path / "p.jsonl", lines)
    before = stored_counts(pg_env)
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "--model", "m", "--mode", "none"])
    assert result.exit_code == 1
    assert result.output == f"Error: p.jsonl:25001: {expected}\n"
    assert stored_counts(pg_env) == before
