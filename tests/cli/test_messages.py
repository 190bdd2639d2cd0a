"""What a user meets at the CLI, exactly: a fast help that loads no library, a status that loads only
what reading a job needs, the commands' help kept equal to their docstrings, click's usage error for a
missing --model, the candidates of an ambiguous id prefix, wall-clock tokens/s beside decoding
tokens/s, models named as given, counted nouns, the schema check's words, and an embedded submit that
shows its progress on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from genjob import db
from genjob.cli import main
from genjob.cli.lazy import COMMANDS, load_command
from genjob.db import session_scope
from genjob.tables import Item, Job
from tests.support.store import result_of

DOUBLES = Path(__file__).resolve().parents[1] / "doubles"  # the scripted stand-in for the models


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), prog_name="genjob")
    return result.exit_code, result.output


def add_job(url: str, job_id: str, *, created: datetime | None = None, **fields: object) -> None:
    """A job row as the store leaves one (the embedded database migrated by a first command)."""
    invoke("jobs")
    job = Job(id=job_id, model="m", mode="none", spec={}, queue="gpu", total=1, status="completed")
    job.created_at = created or datetime.now(UTC)
    for name, value in fields.items():
        setattr(job, name, value)
    with session_scope(url) as session:
        session.add(job)


def test_help_loads_no_library_and_names_granian() -> None:
    code = (
        "import sys\nfrom genjob.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('sqlalchemy', 'celery', 'pydantic', 'rich', 'torch', 'alembic') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[-1] == "[]"
    assert "  api        Serve the HTTP API (FastAPI on Granian): POST /v1/jobs and..." in lines
    assert "  stats      Show a job's acceptance rate, wall-clock and decode..." in lines


def test_genjob_api_help_names_granian() -> None:
    code, output = invoke("api", "--help")
    assert (code, output.splitlines()[2]) == (
        0,
        "  Serve the HTTP API (FastAPI on Granian): POST /v1/jobs and friends.",
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_help_list_is_each_commands_own_docstring(name: str) -> None:
    """`genjob --help` lists the commands without importing them: from a table, kept equal here."""
    command = load_command(name)
    assert command.get_short_help_str(limit=1000) == COMMANDS[name].summary
    assert invoke(name, "--help")[0] == 0


def test_every_command_module_is_in_the_table() -> None:
    import importlib

    modules = {entry.module for entry in COMMANDS.values()}
    listed = {
        command.name
        for module in modules
        for command in importlib.import_module(f"genjob.cli.{module}").COMMANDS
    }
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("args", [["status", "nope"], ["stats", "nope"], ["jobs"]])
def test_reading_a_job_loads_only_what_it_needs(embedded_env: str, args: list[str]) -> None:
    """No Celery, Alembic or torch; and, since the store loads its modules on first use and the
    database URL is read without pydantic: no psycopg, pydantic, the chunk stores or the job options."""
    invoke("jobs")  # migrated once: a later command finds the database at head
    unneeded = (
        "celery", "alembic", "torch", "fastapi", "rich", "psycopg", "pydantic", "pydantic_settings",
        "genjob.settings", "genjob.options", "genjob.store.chunks", "genjob.store.postgres_chunk_ends",
    )  # fmt: skip
    code = (
        f"import sys\nfrom genjob.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n"
        f"    pass\nprint([m for m in {unneeded!r} if m in sys.modules])"
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GENJOB_")}
    env["GENJOB_DATABASE_URL"] = embedded_env  # the only setting: none other to check with pydantic
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]", done.stderr
    if args[0] != "jobs":
        assert done.stderr == "Error: no job 'nope'\n"


def test_a_missing_model_is_a_usage_error(embedded_env: str, tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n', encoding="utf-8")
    assert invoke("submit", "p.jsonl") == (
        2,
        "Usage: genjob submit [OPTIONS] PROMPTS\nTry 'genjob submit --help' for help.\n\n"
        "Error: Missing option '-m' / '--model'.\n",
    )


def test_an_ambiguous_prefix_lists_the_candidates(embedded_env: str) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n, job_id in enumerate(("6a0000000000", "6b0000000000", "6c0000000000", "7a0000000000")):
        add_job(embedded_env, job_id, created=start + timedelta(minutes=n))
    assert invoke("status", "6") == (
        1,
        "Error: '6' names 3 jobs: 6c0000000000, 6b0000000000, 6a0000000000 (give more of the id)\n",
    )
    assert invoke("status", "6b")[1].startswith("job:       6b0000000000\n")
    assert invoke("status", "8") == (1, "Error: no job '8'\n")
    for n in range(4):
        add_job(embedded_env, f"6d{n:010d}", created=start + timedelta(hours=1, minutes=n))
    assert invoke("cancel", "6") == (
        1,
        "Error: '6' names 7 jobs: 6d0000000003, 6d0000000002, 6d0000000001, 6d0000000000, 6c0000000000"
        " and 2 more (give more of the id)\n",
    )


def test_stats_shows_wall_clock_tokens_per_second_beside_decoding(embedded_env: str) -> None:
    started = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    add_job(
        embedded_env,
        "5a0000000000",
        new_tokens=6,
        generate_seconds=0.106,
        done=1,
        started_at=started,
        finished_at=started + timedelta(seconds=61),
    )
    code, output = invoke("stats", "5a")
    lines = output.splitlines()
    assert code == 0
    assert lines[11:13] == [
        "tokens/s wall-clock:     0.1  (new tokens / 61.0 s from start to end)",
        "tokens/s decoding:       56.6  (new tokens / the items' 0.1 s of decoding)",
    ]
    figures = json.loads(invoke("stats", "5a", "--json")[1])
    assert (figures["elapsed_seconds"], round(figures["elapsed_tokens_per_second"], 4)) == (61.0, 0.0984)
    assert round(figures["tokens_per_second"], 1) == 56.6


def test_outputs_name_a_model_given_as_a_path_whole(embedded_env: str) -> None:
    """Two models called `target` in two directories must not look alike (the API keeps the last part)."""
    add_job(embedded_env, "4a0000000000", model="/models/a/target", assistant="/models/a/draft", mode="draft")
    with session_scope(embedded_env) as session:
        item = Item(job_id="4a0000000000", seq=0, line=1, prompt="p", status="done")
        session.add(item)
        session.flush()
        session.add(result_of(item_id=item.id, job_id="4a0000000000", mode="draft"))
    shown = json.loads(invoke("status", "4a", "--json")[1])
    assert (shown["model"], shown["assistant"]) == ("/models/a/target", "/models/a/draft")
    assert (shown["spec"]["model"], shown["spec"]["assistant"]) == ("/models/a/target", "/models/a/draft")
    (line,) = invoke("results", "4a", "--format", "openai")[1].splitlines()
    assert json.loads(line)["response"]["body"]["model"] == "/models/a/target"


def test_the_schema_check_says_what_the_database_is(tmp_path: Path) -> None:
    assert db.quick_head_revision() == db.head_revision()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(db.SchemaError) as raised:
        db.ensure_schema(empty, auto_upgrade=False)
    assert str(raised.value) == (
        f"the database is empty (no tables), not at {db.head_revision()}: run `genjob db upgrade`"
    )
    stale = f"sqlite:///{tmp_path / 'stale.db'}"
    db.upgrade(stale, "0001")
    with pytest.raises(db.SchemaError) as raised:
        db.ensure_schema(stale, auto_upgrade=False)
    assert str(raised.value) == (
        f"the database is at revision 0001, not at {db.head_revision()}: run `genjob db upgrade`"
    )


def _on_a_terminal(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """Run the scripted genjob with stderr on a pseudo-terminal: (exit code, stdout, terminal text)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "scripted_worker", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    out, _ = process.communicate(timeout=30)
    return process.returncode, out, seen.decode(errors="replace")


@pytest.mark.parametrize("wait", [False, True], ids=["plain", "wait"])
def test_an_embedded_submit_shows_its_progress_on_a_terminal(
    embedded_env: str, tmp_path: Path, wait: bool
) -> None:
    """No broker: the job runs in this process, and a terminal sees it run (never 'waiting for a
    worker': this process is the worker)."""
    (tmp_path / "p.jsonl").write_text(
        "".join(json.dumps({"prompt": f"item {i} sleep=0.3"}) + "\n" for i in range(4)), encoding="utf-8"
    )
    env = {
        **os.environ,
        "GENJOB_DATABASE_URL": embedded_env,
        "GENJOB_BATCH_SIZE": "1",
        "PYTHONPATH": os.pathsep.join([str(DOUBLES), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "100",
    }
    args = ["submit", "p.jsonl", "-m", "m", "--mode", "none", *(["--wait"] if wait else [])]
    code, out, terminal = _on_a_terminal(args, tmp_path, env)
    assert code == 0, terminal
    assert len(out.strip()) == 12  # the job id, on stdout as ever
    assert "4/4" in terminal  # the progress bar, drawn
    assert "waiting for a worker" not in terminal
    assert terminal.rstrip().endswith("completed: 4 done, 0 failed of 4") == wait
