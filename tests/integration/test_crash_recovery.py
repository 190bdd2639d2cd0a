"""Crashes and outages on real processes lose nothing and duplicate nothing.

Real `genjob worker` processes on real Redis and Postgres, with the models replaced by the
scripted stand-in (tests/doubles/model_doubles.py) so a kill lands mid-item: SIGKILL of the pool child, of a
whole worker, a Redis restart (our own redis-server) and Postgres connections terminated.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, text

from genjob.queueing import queue_depths
from genjob.worker.sweeper import broker_mark_key
from tests.support.databases import broker_marked
from tests.support.jobs import assert_exactly_once, job_row, lost_attempts, wait_for_job_end
from tests.support.processes import FAST_RECOVERY, RedisServer, run_cli, service_env, submit
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def slow_job_with_a_marked_item(tmp_path: Path, *, items: int, marked: int) -> tuple[Path, Path]:
    """Items of 0.3 s each; item ``marked`` writes the pid of the process running it, then takes 5 s."""
    pid_file = tmp_path / "victim.pid"
    prompts = [
        f"item {i} " + (f"pid-file={pid_file} sleep=5" if i == marked else "sleep=0.3") for i in range(items)
    ]
    return prompts_file(tmp_path / "prompts.jsonl", prompts), pid_file


@pytest.mark.parametrize("victim", ["pool-child", "whole-worker"])
def test_sigkill_mid_chunk_loses_and_duplicates_nothing(
    victim: str, pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    env = service_env(pg_url, queue_name, **FAST_RECOVERY)
    workers = [start_worker(name, env) for name in (f"{queue_name}-a", f"{queue_name}-b")]
    path, pid_file = slow_job_with_a_marked_item(tmp_path, items=12, marked=2)
    job_id = submit(env, path, "--chunk-size", "6")

    pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=90, what="item 2 to start")
    )
    owner = next(w for w in workers if pid in w.children())
    if victim == "pool-child":
        os.kill(pid, signal.SIGKILL)  # Celery sees WorkerLostError and requeues the message
    else:
        owner.kill()  # the message stays unacked in Redis: the other worker's sweeper takes over

    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done, job.failed) == ("completed", 12, 0), job.error
    assert_exactly_once(pg_url, job_id, 12)
    assert lost_attempts(pg_url, job_id) == 1  # the killed try, closed when its lease ran out
    if victim == "pool-child":
        assert "WorkerLostError" in owner.log() or "SIGKILL" in owner.log()


def test_redis_restart_mid_job_and_submit_during_the_outage(
    pg_url: str, queue_name: str, tmp_path: Path, own_redis: RedisServer, start_worker
) -> None:
    env = service_env(pg_url, queue_name, broker_url=own_redis.url, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", env)
    wait_for(lambda: broker_marked(own_redis.url, pg_url), timeout=90, what="the worker's sweeper to mark it")

    path = prompts_file(tmp_path / "p.jsonl", [f"item {i} sleep=0.2" for i in range(20)])
    job_id = submit(env, path, "--chunk-size", "4")
    wait_for(lambda: job_row(pg_url, job_id).done >= 2, timeout=90, what="two items done")
    own_redis.stop()  # the queued chunks are gone with it
    wait_for(lambda: "Connection to broker lost" in worker.log(), timeout=30, what="the worker to miss it")
    own_redis.start()
    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done) == ("completed", 20)
    assert_exactly_once(pg_url, job_id, 20)
    assert "queued" in worker.log() and "chunks again" in worker.log()

    own_redis.stop()
    second = prompts_file(tmp_path / "q.jsonl", [f"again {i}" for i in range(5)])
    failed = run_cli(env, "submit", str(second), "-m", "scripted", "--mode", "none")
    assert failed.returncode == 1
    stored = failed.stdout.strip()
    assert f"Error: job {stored} is stored but could not be queued on" in failed.stderr
    assert failed.stderr.rstrip().endswith(f"once the broker is back: genjob requeue {stored}")
    assert job_row(pg_url, stored).status == "queued"
    own_redis.start()
    # The worker's sweeper may queue the stored job by itself once the broker is back (its marker is
    # gone, and the job's publisher stopped before queueing anything), and even finish it, before
    # the user's requeue: requeue is safe on a job in any state, and sends only what is missing.
    requeued = run_cli(env, "requeue", stored)
    assert requeued.returncode == 0, requeued.stderr
    assert requeued.stdout in (
        f"queued 1 chunk of job {stored}\n",
        f"job {stored} is missing nothing: its items are queued or held by workers (--all: again)\n",
        f"job {stored} already ended (completed): nothing to queue\n",
    )
    job = wait_for_job_end(pg_url, stored, timeout=90)
    assert (job.status, job.done) == ("completed", 5)
    assert_exactly_once(pg_url, stored, 5)


def test_requeue_after_a_flushall_queues_what_the_broker_lost(
    pg_url: str, queue_name: str, tmp_path: Path, own_redis: RedisServer, start_worker
) -> None:
    """A broker flushed with no worker running: nothing would ever notice (the workers' sweepers do,
    once one runs), and `genjob requeue` used to find nothing missing. It queues the lost chunks, and
    a worker started then completes the job exactly once."""
    env = service_env(pg_url, queue_name, broker_url=own_redis.url)
    broker = redis.Redis.from_url(own_redis.url)
    broker.set(broker_mark_key(pg_url), "marked by a worker's sweeper")
    job_id = submit(
        env, prompts_file(tmp_path / "p.jsonl", [f"item {i}" for i in range(10)]), "--chunk-size", "4"
    )
    depth = lambda: queue_depths(own_redis.url, [queue_name])[queue_name]  # noqa: E731
    assert depth() == 3
    nothing = run_cli(env, "requeue", job_id, "--dry-run")
    assert nothing.stdout == f"job {job_id} is missing nothing\n"
    broker.flushall()
    assert depth() == 0
    dry = run_cli(env, "requeue", job_id, "--chunk-size", "4", "--dry-run")
    assert (dry.returncode, dry.stdout, depth()) == (0, f"would queue 3 chunks of job {job_id}\n", 0)
    requeued = run_cli(env, "requeue", job_id, "--chunk-size", "4")
    assert (requeued.returncode, requeued.stdout) == (0, f"queued 3 chunks of job {job_id}\n")
    assert depth() == 3
    start_worker(f"{queue_name}-a", env)
    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done) == ("completed", 10)
    assert_exactly_once(pg_url, job_id, 10)


def test_postgres_connections_dropped_mid_job(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    app_name = f"genjob-{queue_name}"
    worker_env = service_env(f"{pg_url}?application_name={app_name}", queue_name, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", worker_env)
    path = prompts_file(tmp_path / "p.jsonl", [f"item {i} sleep=0.05" for i in range(40)])
    job_id = submit(service_env(pg_url, queue_name), path, "--chunk-size", "5")

    database = pg_url.rsplit("/", 1)[1]
    terminate = text(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = :db AND application_name = :app AND state IN ('active', 'idle in transaction')"
    )
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    busy_kills = 0
    with admin.connect() as connection:
        deadline = time.monotonic() + 90
        while (
            busy_kills < 3 and time.monotonic() < deadline and job_row(pg_url, job_id).status != "completed"
        ):
            busy_kills += connection.execute(terminate, {"db": database, "app": app_name}).scalar_one()
        # and every idle one too, once: the pool's pre-ping replaces those
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :db AND application_name = :app"
            ),
            {"db": database, "app": app_name},
        )
    admin.dispose()

    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done, job.failed) == ("completed", 40, 0)
    assert_exactly_once(pg_url, job_id, 40)
    assert busy_kills >= 3, "the job ended before three of its transactions were cut"
    assert "database error in" in worker.log()  # retried with backoff, then succeeded
