"""Real `genjob worker` processes for integration tests: start, find their pool children, kill.

Workers run the real Celery worker on the real broker and database; only the models are replaced
(``tests/doubles/model_doubles.py``), with leases and sweeps short enough for a test to watch recovery.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import process_helpers
from conftest import REDIS_URL, write_jsonl
from process_helpers import GENJOB
from sqlalchemy import text

from genjob.db import get_engine, session_scope
from genjob.tables import Job

# On the workers' path: only the doubles (tests/ itself has genjob/ and worker/ folders).
DOUBLES_DIR = Path(__file__).resolve().parent / "doubles"

# `genjob` with the scripted stand-in for the models (tests/doubles/scripted_worker.py).
SCRIPTED_GENJOB = [sys.executable, "-m", "scripted_worker"]

# Short leases and sweeps, quick retries.
FAST_RECOVERY = {
    "lease_s": "5",
    "sweep_interval_s": "0.5",
    "retry_backoff_s": "0.1",
    "batch_size": "1",  # the stand-in decodes one item at a time (worker/batched.py needs real models)
}


def service_env(pg_url: str, queue: str, *, broker_url: str = REDIS_URL, **settings: str) -> dict[str, str]:
    """The environment of a CLI or worker process: ``settings`` as GENJOB_*, the doubles importable."""
    pythonpath = os.pathsep.join(filter(None, [str(DOUBLES_DIR), os.environ.get("PYTHONPATH")]))
    extra = {f"GENJOB_{key.upper()}": value for key, value in settings.items()}
    env = process_helpers.service_env(pg_url, queue, PYTHONPATH=pythonpath, **extra)
    env["GENJOB_BROKER_URL"] = broker_url
    return env


class WorkerProcess:
    """One `genjob worker -c 1` (a Celery main process and its one pool child) in its own session."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("w")
        self.process = subprocess.Popen(
            [*SCRIPTED_GENJOB, "-v", "worker", "-Q", env["GENJOB_QUEUE"], "-c", "1", "-n", f"{name}@%h"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def pool_pids(self) -> list[int]:
        """The pool children (forked by any thread of the main process)."""
        pids = []
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            try:
                pids += [int(pid) for pid in (task / "children").read_text().split()]
            except OSError:
                continue
        return pids

    def kill(self) -> None:
        """SIGKILL the whole worker: main process and pool children, no chance to clean up."""
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def run_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([GENJOB, *args], env=env, capture_output=True, text=True, timeout=timeout)


def submit(env: dict[str, str], path: Path, *args: str) -> str:
    """`genjob submit PATH --mode none -m scripted ARGS`; returns the job id."""
    done = run_cli(env, "submit", str(path), "-m", "scripted", "--mode", "none", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def prompts_file(path: Path, prompts: Iterable[str]) -> Path:
    return write_jsonl(path, [json.dumps({"prompt": p, "id": f"q{i:03d}"}) for i, p in enumerate(prompts)])


def wait_for(predicate: Callable[[], object], *, timeout: float, what: str, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def job_row(pg_url: str, job_id: str) -> Job:
    with session_scope(pg_url) as session:
        return session.get(Job, job_id, populate_existing=True)


def wait_for_job_end(pg_url: str, job_id: str, *, timeout: float = 90) -> Job:
    terminal = {"completed", "failed", "cancelled", "expired"}
    return wait_for(
        lambda: (job := job_row(pg_url, job_id)).status in terminal and job,
        timeout=timeout,
        what=f"job {job_id} to end",
    )


def exactly_once_report(pg_url: str, job_id: str) -> dict[str, int]:
    """Counts that prove exactly-once: results per item, done attempts, overlapping attempts."""
    queries = {
        "items": "SELECT count(*) FROM items WHERE job_id = :job",
        "done_items": "SELECT count(*) FROM items WHERE job_id = :job AND status = 'done'",
        "results": "SELECT count(*) FROM results WHERE job_id = :job",
        "items_with_one_result": """
            SELECT count(*) FROM items i WHERE i.job_id = :job
            AND (SELECT count(*) FROM results r WHERE r.item_id = i.id) = 1""",
        "results_matching_prompt": """
            SELECT count(*) FROM results r JOIN items i ON i.id = r.item_id
            WHERE r.job_id = :job AND r.output = 'echo: ' || i.prompt""",
        "done_attempts": """
            SELECT count(*) FROM attempts a JOIN items i ON i.id = a.item_id
            WHERE i.job_id = :job AND a.outcome = 'done'""",
        "open_attempts": """
            SELECT count(*) FROM attempts a JOIN items i ON i.id = a.item_id
            WHERE i.job_id = :job AND a.finished_at IS NULL""",
        "overlapping_attempts": """
            SELECT count(*) FROM attempts a JOIN attempts b ON a.item_id = b.item_id AND a.id < b.id
            JOIN items i ON i.id = a.item_id
            WHERE i.job_id = :job
            AND a.started_at < coalesce(b.finished_at, 'infinity')
            AND b.started_at < coalesce(a.finished_at, 'infinity')""",
        "job_done_counter": "SELECT done FROM jobs WHERE id = :job",
    }
    with get_engine(pg_url).connect() as connection:
        return {
            name: connection.execute(text(sql), {"job": job_id}).scalar_one() for name, sql in queries.items()
        }
