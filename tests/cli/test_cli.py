"""The CLI in embedded mode (no broker, SQLite): exact output of every job command."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from genjob.cli import main
from genjob.cli.lazy import COMMANDS, load_command
from genjob.db import session_scope
from genjob.options import JobOptions
from genjob.tables import Job
from tests.support.prompts import write_jsonl


@pytest.fixture
def finished_job(embedded_env: str, tiny_pair: tuple[Path, Path], tmp_path: Path) -> str:
    target, draft = tiny_pair
    write_jsonl(
        tmp_path / "p.jsonl",
        [
            json.dumps({"prompt": "def foo(x):", "id": "first"}),
            json.dumps({"prompt": "import os", "max_new_tokens": 3}),
            json.dumps({"prompt": "class A:", "id": "third"}),
        ],
    )
    result = CliRunner().invoke(
        main,
        ["submit", "p.jsonl", "-m", str(target), "-a", str(draft), "--max-new-tokens", "6", "--name", "t"],
    )
    assert result.exit_code == 0, result.output
    return result.output.strip()


def test_submit_prints_the_job_id_and_runs_it_in_process(finished_job: str, embedded_env: str) -> None:
    assert len(finished_job) == 12
    with session_scope(embedded_env) as session:
        job = session.get(Job, finished_job)
        assert (job.status, job.total, job.done, job.failed, job.name) == ("completed", 3, 3, 0, "t")


def test_status(finished_job: str) -> None:
    output = CliRunner().invoke(main, ["status", finished_job[:6]]).output.splitlines()
    assert output[0] == f"job:       {finished_job}  (t)"
    assert output[1:3] == ["status:    completed", "items:     3 total, 3 done, 0 failed"]
    assert output[4].endswith("(mode auto)")


def test_results_jsonl_in_input_order(finished_job: str) -> None:
    result = CliRunner().invoke(main, ["results", finished_job])
    records = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["id"], r["index"], r["line"], r["status"]) for r in records] == [
        ("first", 0, 1, "done"),
        (None, 1, 2, "done"),
        ("third", 2, 3, "done"),
    ]
    assert [r["new_tokens"] for r in records] == [6, 3, 6]


def test_results_csv_to_a_file(finished_job: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["results", finished_job, "--format", "csv", "-o", "out.csv"])
    assert result.exit_code == 0
    assert result.output == "wrote 3 records to out.csv\n"
    rows = list(csv.DictReader(io.StringIO((tmp_path / "out.csv").read_text())))
    assert [row["id"] for row in rows] == ["first", "", "third"]
    assert not list(tmp_path.glob(".out.csv.*"))


def test_stats(finished_job: str) -> None:
    lines = CliRunner().invoke(main, ["stats", finished_job]).output.splitlines()
    assert lines[0] == f"job:                     {finished_job}  (completed, 3/3 done)"
    assert lines[1] == "mode:                    auto"
    assert lines[2] == "new tokens:              15"


def test_jobs_lists_newest_first(finished_job: str) -> None:
    lines = CliRunner().invoke(main, ["jobs"]).output.splitlines()
    assert lines[0] == "id            status      done/total    created              name"
    assert lines[1].startswith(f"{finished_job}  completed       3/3   ")
    assert lines[1].endswith("  t")


def test_cancel_an_ended_job_is_an_error(finished_job: str) -> None:
    result = CliRunner().invoke(main, ["cancel", finished_job])
    assert result.exit_code == 1
    assert result.output == f"Error: job {finished_job} already ended (completed)\n"


def test_unknown_job(embedded_env: str) -> None:
    result = CliRunner().invoke(main, ["status", "nope"])
    assert (result.exit_code, result.output) == (1, "Error: no job 'nope'\n")


def test_unloadable_model_fails_the_job_with_its_error(embedded_env: str, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "x"})])
    (tmp_path / "empty").mkdir()  # a directory, so submit takes it, but no model in it
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", str(tmp_path / "empty"), "--wait"])
    assert result.exit_code == 3  # every item failed
    job_id = result.stdout.strip()
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        assert job.status == "failed" and job.failed == 1
        assert job.error.startswith(f"cannot load model '{tmp_path / 'empty'}'")


def test_draft_mode_needs_an_assistant(embedded_env: str, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "x"})])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--mode", "draft"])
    assert result.output == "Error: invalid job options: mode 'draft' needs an assistant (draft) model\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft-tokens", "0"], "Invalid value for '--draft-tokens': 0 is not in the range 1<=x<=64."),
        (["--top-p", "0"], "Invalid value for '--top-p': 0.0 is not in the range 0.0<x<=1.0."),
        (
            ["--mode", "fast"],
            "Invalid value for '--mode': 'fast' is not one of 'draft', 'prompt-lookup', 'none', 'auto'.",
        ),
        (
            ["--name", "a\tb"],
            "Invalid value for '--name': String should match pattern '^[^\\x00-\\x1f\\x7f]*$'",
        ),
    ],
)
def test_submit_options_are_checked_by_their_declaration(
    embedded_env: str, tmp_path: Path, args: list[str], message: str
) -> None:
    """The options come from genjob.options.JobOptions: its ranges, choices and patterns apply."""
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "x"})])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", *args])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == f"Error: {message}"


def test_every_job_option_is_a_submit_option() -> None:
    names = {param.name for param in load_command("submit").params}
    assert set(JobOptions.model_fields) <= names


def test_every_command_has_help() -> None:
    for name in COMMANDS:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        assert load_command(name).help, name


def test_expire_after_must_be_a_duration(embedded_env: str, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "x"})])
    result = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--expire-after", "10x"])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--expire-after': '10x' is not a duration like 30s, 10m, 2h, 1d or 1h30m"
    )


def test_retry_reruns_the_failed_items_only(embedded_env: str, scripted_models, tmp_path: Path) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}', f'{{"prompt": "b poison-while={poison}"}}'])
    submitted = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m", "--wait"])
    assert submitted.exit_code == 3, submitted.output  # some items failed
    job_id = submitted.stdout.strip()
    assert submitted.stderr == "completed: 1 done, 1 failed of 2\n"
    records = [json.loads(line) for line in CliRunner().invoke(main, ["results", job_id]).output.splitlines()]
    assert [(r["status"], r["error"]) for r in records] == [
        ("done", None),
        ("failed", "PoisonError: poisoned item 1 (attempt 3 of 3)"),
    ]

    poison.unlink()
    retried = CliRunner().invoke(main, ["retry", job_id])
    assert (retried.exit_code, retried.output) == (0, f"retrying 1 failed item of job {job_id}\n")
    with session_scope(embedded_env) as session:
        job = session.get(Job, job_id)
        assert (job.status, job.done, job.failed) == ("completed", 2, 0)

    again = CliRunner().invoke(main, ["retry", job_id])
    assert (again.exit_code, again.output) == (0, f"job {job_id} has no failed items: nothing to retry\n")


def test_retry_refuses_a_cancelled_job(embedded_env: str, scripted_models, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}'])
    job_id = CliRunner().invoke(main, ["submit", "p.jsonl", "-m", "m"]).output.strip()
    with session_scope(embedded_env) as session:
        session.get(Job, job_id).status = "cancelled"
    result = CliRunner().invoke(main, ["retry", job_id])
    assert (result.exit_code, result.output) == (
        1,
        f"Error: job {job_id} ended cancelled: only failed items of a live, completed or failed job "
        "are retried\n",
    )


def test_the_job_records_its_model_revisions_and_library_versions(
    finished_job: str, embedded_env: str
) -> None:
    with session_scope(embedded_env) as session:
        job = session.get(Job, finished_job)
        assert job.model_revision.startswith("sha256:") and len(job.model_revision) == 71
        assert job.assistant_revision.startswith("sha256:") and job.assistant_revision != job.model_revision
        assert {"python", "genjob", "torch", "transformers"} <= set(job.versions)
