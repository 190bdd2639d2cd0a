"""The CLI for operators and scripts: exit codes, wait, --json, --name, results filters and formats,
delete and purge, one-line errors. Embedded mode with the scripted stand-in for the models."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import stat
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import update

from genjob.api.schemas import JobOut
from genjob.cli import main
from genjob.cli import results as results_module
from genjob.db import session_scope
from genjob.tables import Job, utcnow
from tests.support.prompts import write_jsonl


def invoke(*args: str, **kwargs) -> Result:
    return CliRunner().invoke(main, list(args), **kwargs)


def submit(tmp_path: Path, prompts: list[str], *args: str) -> Result:
    write_jsonl(
        tmp_path / "p.jsonl", [json.dumps({"prompt": p, "id": f"q{i}"}) for i, p in enumerate(prompts)]
    )
    return invoke("submit", "p.jsonl", "-m", "m", "--mode", "none", *args)


@pytest.fixture
def env(embedded_env: str, scripted_models: None) -> str:
    return embedded_env


def test_embedded_submit_exit_codes(env: str, tmp_path: Path) -> None:
    clean = submit(tmp_path, ["a", "b"])
    assert (clean.exit_code, clean.stderr) == (0, "")
    assert re.fullmatch(r"[0-9a-f]{12}\n", clean.stdout)

    failing = submit(tmp_path, ["a", "b poison"])
    assert failing.exit_code == 3
    assert failing.stderr == "completed: 1 done, 1 failed of 2\n"

    expired = submit(tmp_path, [f"x{i} sleep=0.3" for i in range(8)], "--expire-after", "1s")
    assert expired.exit_code == 4
    assert expired.stderr.startswith("expired: ")


def test_wait_exit_codes(env: str, tmp_path: Path) -> None:
    done = submit(tmp_path, ["a", "b", "c"]).stdout.strip()
    assert (invoke("wait", done).exit_code, invoke("wait", done).stderr) == (
        0,
        "completed: 3 done, 0 failed of 3\n",
    )
    failed = submit(tmp_path, ["a poison"]).stdout.strip()
    result = invoke("wait", failed, "-q")
    assert (result.exit_code, result.stderr) == (3, "failed: 0 done, 1 failed of 1\n")
    with session_scope(env) as session:
        session.get(Job, done).status = "cancelled"
    assert invoke("wait", done).exit_code == 4


def test_json_output_is_the_apis(env: str, tmp_path: Path) -> None:
    job_id = submit(tmp_path, ["a", "b"], "--name", "nightly").stdout.strip()
    status = json.loads(invoke("status", job_id, "--json").stdout)
    with session_scope(env) as session:
        assert status == JobOut.of(session.get(Job, job_id)).model_dump(mode="json")
    assert (status["id"], status["name"], status["done"]) == (job_id, "nightly", 2)
    listed = json.loads(invoke("jobs", "--json").stdout)
    assert [job["id"] for job in listed] == [job_id]
    stats = json.loads(invoke("stats", job_id, "--json").stdout)
    assert (stats["id"], stats["status"], stats["new_tokens"], stats["done"]) == (job_id, "completed", 2, 2)


def test_jobs_found_by_name_the_newest_with_a_note(env: str, tmp_path: Path) -> None:
    first = submit(tmp_path, ["a"], "--name", "nightly").stdout.strip()
    second = submit(tmp_path, ["a", "b"], "--name", "nightly").stdout.strip()
    with session_scope(env) as session:
        session.get(Job, first).created_at = utcnow() - timedelta(hours=1)
    result = invoke("status", "--name", "nightly")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == f"job:       {second}  (nightly)"
    assert re.fullmatch(
        rf"note: 2 jobs are named 'nightly'; using the newest, {second} \(created [-0-9: ]+\)\n",
        result.stderr,
    )
    assert invoke("status", "--name", "other").output == "Error: no job named 'other'\n"
    both = invoke("status", first, "--name", "nightly")
    assert both.exit_code == 2
    assert (
        both.output.splitlines()[-1] == "Error: name the job: JOB (its id, or a unique prefix) or --name NAME"
    )
    assert invoke("results", "--name", "nightly", "--status", "done").stdout.count("\n") == 2


def test_results_filters_and_csv_safety(env: str, tmp_path: Path) -> None:
    job_id = submit(tmp_path, ["=HYPERLINK(1)", "b poison", "-2"]).stdout.strip()
    failed = [
        json.loads(line) for line in invoke("results", job_id, "--status", "failed").stdout.splitlines()
    ]
    assert [(r["id"], r["status"], r["mode"]) for r in failed] == [("q1", "failed", None)]
    done = [json.loads(line) for line in invoke("results", job_id, "--status", "done").stdout.splitlines()]
    assert [(r["id"], r["output"], r["mode"]) for r in done] == [
        ("q0", "echo: =HYPERLINK(1)", "none"),
        ("q2", "echo: -2", "none"),
    ]

    exact = list(csv.DictReader(io.StringIO(invoke("results", job_id, "--format", "csv").stdout)))
    assert exact[0]["output"] == "echo: =HYPERLINK(1)"  # exact bytes by default
    write_jsonl(tmp_path / "f.jsonl", [json.dumps({"prompt": "x", "id": "=cmd|' /C calc'!A0"})])
    formula = invoke("submit", "f.jsonl", "-m", "m", "--mode", "none").stdout.strip()
    safe = list(
        csv.DictReader(io.StringIO(invoke("results", formula, "--format", "csv", "--csv-safe").stdout))
    )
    plain = list(csv.DictReader(io.StringIO(invoke("results", formula, "--format", "csv").stdout)))
    assert (safe[0]["id"], plain[0]["id"]) == ("'=cmd|' /C calc'!A0", "=cmd|' /C calc'!A0")


def test_parquet_to_a_file_with_the_users_umask(env: str, tmp_path: Path) -> None:
    job_id = submit(tmp_path, ["a", "b poison"]).stdout.strip()
    old = os.umask(0o027)
    try:
        result = invoke("results", job_id, "--format", "parquet", "-o", "out.parquet")
    finally:
        os.umask(old)
    assert (result.exit_code, result.output) == (0, "wrote 2 records to out.parquet\n")
    assert stat.S_IMODE((tmp_path / "out.parquet").stat().st_mode) == 0o640
    table = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(r["id"], r["status"], r["new_tokens"]) for r in table] == [
        ("q0", "done", 1),
        ("q1", "failed", None),
    ]
    csv_out = invoke("results", job_id, "--format", "csv", "--status", "failed", "-o", "f.csv")
    assert csv_out.output == "wrote 1 record to f.csv\n"


def test_results_errors_are_one_line(env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id = submit(tmp_path, ["a"]).stdout.strip()
    missing = invoke("results", job_id, "-o", "nowhere/out.jsonl")
    assert (missing.exit_code, missing.output) == (
        1,
        "Error: cannot write nowhere/out.jsonl: directory 'nowhere' does not exist\n",
    )
    monkeypatch.setattr(results_module, "_on_terminal", lambda: True)
    assert invoke("results", job_id, "--format", "parquet").output == (
        "Error: Parquet is binary: write it to a file (-o FILE) or a pipe\n"
    )


def test_terminal_output_escapes_control_characters(env: str, tmp_path: Path, monkeypatch) -> None:
    write_jsonl(tmp_path / "p.jsonl", [json.dumps({"prompt": "a\x1b[2Jb", "id": "x\x9b1"})])
    job_id = invoke("submit", "p.jsonl", "-m", "m", "--mode", "none").stdout.strip()
    raw = invoke("results", job_id, "--format", "csv").stdout
    assert "\x1b[2J" in raw and "\x9b" in raw  # a pipe gets the exact text
    monkeypatch.setattr(results_module, "_on_terminal", lambda: True)
    shown = invoke("results", job_id, "--format", "csv").stdout
    assert "\x1b" not in shown and "\x9b" not in shown
    assert shown.splitlines()[1].startswith("x\\x9b1,0,1,done,echo: a\\x1b[2Jb,")


def test_delete_refuses_a_live_job_unless_forced(env: str, tmp_path: Path) -> None:
    job_id = submit(tmp_path, ["a"]).stdout.strip()
    with session_scope(env) as session:
        session.get(Job, job_id).status = "running"
    refused = invoke("delete", job_id)
    assert (refused.exit_code, refused.output) == (
        1,
        f"Error: job {job_id} is running: cancel it first (genjob cancel {job_id}) or use --force\n",
    )
    forced = invoke("delete", job_id, "--force")
    assert (forced.exit_code, forced.stdout, forced.stderr) == (
        0,
        f"deleted job {job_id} (1 item)\n",
        f"cancelled {job_id}\n",
    )
    assert invoke("status", job_id).output == f"Error: no job '{job_id}'\n"


def test_purge_old_ended_jobs_in_batches(env: str, tmp_path: Path) -> None:
    old = submit(tmp_path, ["a", "b", "c"]).stdout.strip()
    new = submit(tmp_path, ["a"]).stdout.strip()
    with session_scope(env) as session:
        session.execute(update(Job).where(Job.id == old).values(finished_at=utcnow() - timedelta(days=40)))
    assert invoke("purge", "--older-than", "30d", "--dry-run").output == "would purge 1 job (3 items)\n"
    assert invoke("purge", "--older-than", "30d", "--batch-size", "2").output == "purged 1 job (3 items)\n"
    assert invoke("status", old).exit_code == 1
    assert invoke("status", new).exit_code == 0
    assert invoke("purge", "--older-than", "30d").output == "purged 0 jobs (0 items)\n"


def test_db_downgrade_needs_an_explicit_revision(embedded_env: str) -> None:
    result = invoke("db", "downgrade")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: Missing argument 'REVISION'."


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"GENJOB_CHUNK_SIZE": "lots"},
            "Error: invalid settings: GENJOB_CHUNK_SIZE='lots': Input should be a valid integer, unable to "
            "parse string as an integer\n",
        ),
        (
            {"GENJOB_MODELS": "{demo"},
            "Error: invalid settings: GENJOB_MODELS='{demo': Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)\n",
        ),
    ],
)
def test_bad_settings_are_one_line(monkeypatch: pytest.MonkeyPatch, variables: dict, message: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    result = invoke("jobs")
    assert (result.exit_code, result.output) == (1, message)


def test_an_unreachable_database_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_DATABASE_URL", "postgresql+psycopg://genjob:secret@127.0.0.1:1/genjob")
    result = invoke("status", "abc")
    assert result.exit_code == 1
    assert len(result.output.splitlines()) == 1
    assert result.output.startswith("Error: database postgresql+psycopg://genjob:***@127.0.0.1:1/genjob: ")
    assert result.output.endswith("(check GENJOB_DATABASE_URL and that the server is up)\n")


def test_a_huge_expire_after_is_a_usage_error(env: str, tmp_path: Path) -> None:
    result = submit(tmp_path, ["a"], "--expire-after", "99999999999d")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "Error: Invalid value for '--expire-after': '99999999999d' is too long: at most 3660d"
    )


def test_a_misspelt_model_name_suggests_the_listed_one(env: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("GENJOB_MODELS", json.dumps({"demo": {"target": "/models/demo/target"}}))
    write_jsonl(tmp_path / "p.jsonl", ['{"prompt": "a"}'])
    result = invoke("submit", "p.jsonl", "-m", "demoo")
    assert (result.exit_code, result.output) == (
        1,
        "Error: invalid job options: unknown model 'demoo': did you mean 'demo'? (catalog: demo, smollm2; "
        "or give a path or hub id that exists)\n",
    )


def test_calibrate_measures_once_and_keeps_it(
    tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from genjob.generation import cost_cache, cost_timing

    monkeypatch.setattr(cost_timing, "STEADY_TOLERANCE", float("inf"))  # the suite's machine may be busy
    monkeypatch.setenv("GENJOB_COST_CACHE_DIR", str(tmp_path / "costs"))
    target, draft = tiny_pair
    args = ("calibrate", "-m", str(target), "-a", str(draft), "--batch-size", "2", "--draft-tokens", "3")
    cost_cache.measured_costs.cache_clear()
    first = invoke(*args)
    assert first.exit_code == 0, first.output
    lines = first.output.splitlines()
    assert re.fullmatch(r"batch size 2: plain step [\d.]+ ms, draft step [\d.]+ ms", lines[0])
    assert re.fullmatch(
        r"verification of q tokens per row \(ms\), q 1: [\d.]+, 2: [\d.]+, 3: [\d.]+, 4: [\d.]+", lines[1]
    )
    assert re.fullmatch(
        rf"measured in [\d.]+ s \(loading the models included\); kept in {tmp_path}/costs", lines[2]
    )
    cost_cache.measured_costs.cache_clear()  # as a worker process started later
    second = invoke(*args)
    assert second.exit_code == 0, second.output
    assert second.output.splitlines()[:2] == lines[:2]
    assert second.output.splitlines()[2].startswith("read in ")


def test_calibrate_refuses_bad_options_in_one_line() -> None:
    result = invoke("calibrate", "-m", "m", "--mode", "draft")
    assert result.exit_code == 1
    assert result.output.startswith("Error: invalid job options: ")
    assert len(result.output.splitlines()) == 1
