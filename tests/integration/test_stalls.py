"""Leases follow progress, not the process (issue 23): a pool process stuck inside a round, on real
workers, Redis and Postgres.

The stand-in's ``hang-once=PATH`` directive (tests/doubles/model_doubles.py) hangs the first process
that reaches it for good (a lock taken twice: no round ends, as in a pool process deadlocked in C
code); the next try passes. A stuck pool process stops renewing once GENJOB_ROUND_STALL_S passes
(/healthz says 503 meanwhile) and is killed once its leases ran out, so its items are swept back and
the job ends; a SIGTERM to a worker whose pool process hangs ends it within GENJOB_STOP_GRACE_S plus
the margin, its leases ended.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from genjob.worker.stop_deadline import EXIT_AFTER_S, STOP_MARGIN_S
from tests.support.jobs import assert_exactly_once, live_leases, lost_attempts, wait_for_job_end
from tests.support.processes import FAST_RECOVERY, free_port, service_env, submit
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    """No such process any more (or only its zombie, before its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def job_with_a_hanging_item(tmp_path: Path, *, items: int, hanging: int) -> tuple[Path, Path]:
    """Item ``hanging`` writes the pid of the process running it, then hangs (the first time only)."""
    pid_file, marker = tmp_path / "stuck.pid", tmp_path / "hung-once"
    prompts = [
        f"item {i} " + (f"pid-file={pid_file} hang-once={marker}" if i == hanging else "sleep=0.05")
        for i in range(items)
    ]
    return prompts_file(tmp_path / "prompts.jsonl", prompts), pid_file


def healthz(port: int) -> tuple[int, dict] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except httpx.TransportError:
        return None
    return response.status_code, response.json()


def test_a_pool_process_stuck_in_a_round_is_replaced_and_the_job_ends(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    port = free_port()
    fast = FAST_RECOVERY | {"lease_s": "3", "round_stall_s": "1.5"}
    env = service_env(pg_url, queue_name, **fast, metrics_port=str(port))
    worker = start_worker(f"{queue_name}-a", env)
    wait_for(lambda: healthz(port), timeout=90, what="the worker's /healthz")
    path, pid_file = job_with_a_hanging_item(tmp_path, items=8, hanging=3)
    job_id = submit(env, path, "--chunk-size", "8")

    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=90, what="item 3"))
    started = time.monotonic()

    def stalled() -> dict | None:
        answer = healthz(port)
        if answer is None or answer[0] != 503:
            return None
        return next((p for p in answer[1]["processes"] if p["pid"] == pid and p["stalled"]), None)

    report = wait_for(stalled, timeout=30, what="/healthz to say the pool process is stalled", every=0.05)
    assert report["holding"] and report["since_progress_s"] > 1.5 and report["bound_s"] == 1.5
    wait_for(lambda: gone(pid), timeout=30, what="the stuck pool process to be killed")
    killed_after = time.monotonic() - started
    # renewals stop after the bound (checked every lease/3); it dies once its leases ran out
    assert killed_after < 1.5 + 1 + 3 + 1 + 3, killed_after

    job = wait_for_job_end(pg_url, job_id, timeout=60)
    assert (job.status, job.done, job.failed) == ("completed", 8, 0), job.error
    assert_exactly_once(pg_url, job_id, 8)
    assert lost_attempts(pg_url, job_id) == 1  # the stuck try, closed when the sweeper took it back
    log = worker.log()
    assert f"/{pid}: no progress for " in log and "are no longer renewed" in log
    assert "killing this pool process" in log
    assert wait_for(lambda: (answer := healthz(port)) and answer[0] == 200, timeout=30, what="/healthz 200")
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert "genjob_worker_progress_timestamp_seconds{" in metrics
    assert "genjob_worker_holding_chunk{" in metrics


def test_sigterm_ends_a_worker_whose_pool_process_hangs_within_the_grace(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    grace = 1.0
    # leases and the stall bound far longer than the test: only the stop's deadline can end it
    slow = FAST_RECOVERY | {"lease_s": "60", "round_stall_s": "60", "stop_grace_s": str(grace)}
    env = service_env(pg_url, queue_name, **slow)
    first = start_worker(f"{queue_name}-a", env)
    path, pid_file = job_with_a_hanging_item(tmp_path, items=6, hanging=1)
    job_id = submit(env, path, "--chunk-size", "6")
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=90, what="item 1"))
    assert live_leases(pg_url, job_id) > 0

    stopped_at = time.monotonic()
    os.kill(first.pid, signal.SIGTERM)  # to the main process only, as `docker stop` sends it
    first.process.wait(timeout=grace + STOP_MARGIN_S + 30)
    took = time.monotonic() - stopped_at
    # the deadline kills the hung process at grace + margin; Celery's own exit then takes ~3-4 s here
    # (b8278ed too), and the deadline ends the process itself EXIT_AFTER_S after the kill at the latest
    assert took < grace + STOP_MARGIN_S + EXIT_AFTER_S + 1, took
    assert gone(pid)
    assert live_leases(pg_url, job_id) == 0  # ended, not left to run out (a minute)
    assert f"pool process {pid} had not stopped: killed; its leases on " in first.log()

    start_worker(f"{queue_name}-b", env)  # its sweeper queues the items at once
    job = wait_for_job_end(pg_url, job_id, timeout=90)
    assert (job.status, job.done, job.failed) == ("completed", 6, 0), job.error
    assert_exactly_once(pg_url, job_id, 6)
    assert lost_attempts(pg_url, job_id) == 1  # the killed try
