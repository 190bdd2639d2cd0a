"""The CLI's output and logs hold no password: a broker and a database URL carrying one
(``tests.support.leaks``), grepped for it on every error path they reach (a broker that does not answer
at submit and requeue, an invalid broker URL, a database that does not answer), with -vv logging."""

from __future__ import annotations

from pathlib import Path

from tests.support.leaks import BROKER_SECRET, assert_no_secret, dead_broker_url, planted_database_url
from tests.support.processes import free_port, run_cli, service_env
from tests.support.prompts import prompts_file


def test_the_cli_masks_the_broker_and_the_database(pg_url: str, queue_name: str, tmp_path: Path) -> None:
    database = planted_database_url(pg_url)
    env = service_env(database, queue_name, broker_url=dead_broker_url())
    path = prompts_file(tmp_path / "p.jsonl", ["one", "two"])
    submitted = run_cli(env, "-vv", "submit", str(path), "-m", "scripted", "--mode", "none")
    assert submitted.returncode == 1
    assert "is stored but could not be queued on redis://genjob:***@127.0.0.1:" in submitted.stderr
    job_id = submitted.stdout.strip()
    requeued = run_cli(env, "-vv", "requeue", job_id)
    assert requeued.returncode == 1
    invalid = run_cli({**env, "GENJOB_BROKER_URL": f"notredis://genjob:{BROKER_SECRET}@host/0"}, "jobs")
    assert invalid.stderr.startswith(
        "Error: invalid settings: GENJOB_BROKER_URL='notredis://genjob:***@host/0'"
    )
    unparsed = run_cli({**env, "GENJOB_BROKER_URL": f"genjob:{BROKER_SECRET}@host"}, "jobs")
    assert unparsed.returncode == 1
    dead_database = database.replace(":5432/", f":{free_port()}/")
    no_database = run_cli({**env, "GENJOB_DATABASE_URL": dead_database}, "-vv", "status", job_id)
    last = no_database.stderr.splitlines()[-1]
    assert last.startswith("Error: database postgresql+psycopg://postgres:***@127.0.0.1:")
    for done in (submitted, requeued, invalid, unparsed, no_database):
        assert_no_secret(done.stdout + done.stderr)
