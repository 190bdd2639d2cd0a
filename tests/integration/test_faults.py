"""Every job ends and faults land where they belong (issue 13), on real workers, Redis and Postgres.

A worker whose device cannot start takes no chunk; a worker that fails while holding items costs
each a try, so the job ends after GENJOB_MAX_ATTEMPTS; a submit stopped mid-enqueue is finished by
a sweeper; SIGTERM gives the leases back at once and loses nothing; messages of the old format
(job id, [item ids]) still run; a small job is not stuck behind a huge one on the same queue.
The models are the scripted stand-in (tests/doubles/model_doubles.py); the rest is real.
"""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from genjob import store
from genjob.constants import TASK_GENERATE_CHUNK
from genjob.db import run_transaction, session_scope
from genjob.options import JobSpec
from genjob.queueing import producer_app, publish_ranges
from genjob.settings import Settings
from genjob.submit import store_job
from genjob.tables import Attempt, Item, Job, utcnow
from tests.support.jobs import assert_exactly_once, job_row, live_leases, wait_for_job_end
from tests.support.processes import FAST_RECOVERY, run_cli, service_env, submit, worker_argv
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def stored_job(pg_url: str, queue: str, path: Path, model: str = "scripted") -> str:
    """A job stored as a submit stores it, but nothing queued yet (its submit died right after)."""
    settings = Settings(database_url=pg_url, queue=queue)
    return store_job(settings, path=path, spec=JobSpec(model=model, mode="none")).job_id


def test_a_worker_whose_device_cannot_start_takes_no_chunk_and_says_why(
    pg_url: str, queue_name: str, tmp_path: Path
) -> None:
    env = service_env(pg_url, queue_name, device="cuda:99", **FAST_RECOVERY)
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", ["a", "b"]))
    started = subprocess.run(
        worker_argv(queue_name, queue_name, quiet=True),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert started.returncode == 1
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: worker not started: device 'cuda:99' cannot start: "
    )
    assert lines[0].endswith("set GENJOB_DEVICE to a device this machine has (cpu, cuda:0…)")
    job = job_row(pg_url, job_id)
    assert (job.status, job.started_at) == ("queued", None)  # not `running`: nobody took it
    with session_scope(pg_url) as session:
        assert (
            session.scalar(select(text("count(*)")).select_from(Attempt).where(Attempt.job_id == job_id)) == 0
        )


def test_a_worker_failing_while_holding_items_costs_each_a_try_and_the_job_ends(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    """Its models run out of memory in warm-up (a worker's fault, not the job's): every delivery costs
    the items it held a try, so after GENJOB_MAX_ATTEMPTS they fail with the error and the job ends."""
    env = service_env(pg_url, queue_name, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", env)
    path = prompts_file(tmp_path / "p.jsonl", [f"item {i}" for i in range(4)])
    done = run_cli(env, "submit", str(path), "-m", "scripted-broken", "--mode", "none", "--chunk-size", "2")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done, job.failed) == ("failed", 0, 4)
    error = "WarmUpOutOfMemory: CUDA out of memory in warm-up (tried to allocate 80.00 GiB)"
    with session_scope(pg_url) as session:
        items = session.execute(
            select(Item.status, Item.attempts, Item.error).where(Item.job_id == job_id)
        ).all()
        tries = session.execute(select(Attempt.outcome, Attempt.error).where(Attempt.job_id == job_id)).all()
    assert set(items) == {("failed", 3, f"gave up after 3 attempts; last: {error}")}
    assert sorted(tries) == [("lost", error)] * 12  # three tries of four items, each accounted for
    assert "this worker failed holding 2 items: " + error in worker.log()


def test_a_submit_stopped_mid_enqueue_is_finished_by_a_sweeper(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    path = prompts_file(tmp_path / "p.jsonl", [f"item {i}" for i in range(30)])
    job_id = stored_job(pg_url, queue_name, path)
    app = producer_app(service_env(pg_url, queue_name)["GENJOB_BROKER_URL"])
    # It queued two chunks of 4 and recorded them, then was killed.
    publish_ranges(app, job_id=job_id, queue=queue_name, ranges=[(0, 4), (4, 8)])
    run_transaction(pg_url, store.record_queued, job_id=job_id, queued_seq=8)
    with session_scope(pg_url) as session:  # its last progress, a while ago
        session.execute(
            update(Job).where(Job.id == job_id).values(queue_progress_at=utcnow() - timedelta(minutes=1))
        )
    env = service_env(pg_url, queue_name, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", env)
    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done, job.queued_seq) == ("completed", 30, 30)
    assert_exactly_once(pg_url, job_id, 30)
    assert f"job {job_id}: its submit stopped queueing at item 8 of 30; queueing the rest" in worker.log()
    # nothing is missing now: requeue says so, and does nothing
    requeued = run_cli(env, "requeue", job_id)
    assert (requeued.returncode, requeued.stdout) == (
        0,
        f"job {job_id} already ended (completed): nothing to queue\n",
    )


def test_requeue_sends_only_what_is_missing(pg_url: str, queue_name: str, tmp_path: Path) -> None:
    env = service_env(pg_url, queue_name, chunk_size="4")
    job_id = stored_job(pg_url, queue_name, prompts_file(tmp_path / "p.jsonl", [f"i{i}" for i in range(10)]))
    first = run_cli(env, "requeue", job_id)
    assert (first.returncode, first.stdout) == (0, f"queued 3 chunks of job {job_id}\n")
    again = run_cli(env, "requeue", job_id)
    assert (again.returncode, again.stdout) == (
        0,
        f"job {job_id} is missing nothing: its items are queued or held by workers (--all: again)\n",
    )
    forced = run_cli(env, "requeue", job_id, "--all")
    assert (forced.returncode, forced.stdout) == (0, f"queued 3 chunks of job {job_id}\n")
    run_cli(env, "cancel", job_id)


def test_sigterm_mid_chunk_gives_the_leases_back_at_once_and_loses_nothing(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    env = service_env(pg_url, queue_name, **(FAST_RECOVERY | {"lease_s": "30"}))
    first = start_worker(f"{queue_name}-a", env)
    path = prompts_file(tmp_path / "p.jsonl", [f"item {i} sleep=0.3" for i in range(12)])
    job_id = submit(env, path, "--chunk-size", "12")
    wait_for(lambda: job_row(pg_url, job_id).done >= 2, timeout=90, what="two items done")
    stopped_at = time.monotonic()
    first.stop()  # SIGTERM to the worker and its pool process
    assert time.monotonic() - stopped_at < 15  # within the grace, far sooner than the lease (30 s)
    assert first.process.returncode == 0
    assert live_leases(pg_url, job_id) == 0  # nothing left to wait for: the leases ended when it stopped
    assert "stopping (SIGTERM)" in first.log()

    start_worker(f"{queue_name}-b", env)  # its sweeper queues the given-back items at once
    job = wait_for_job_end(pg_url, job_id, timeout=90)
    assert (job.status, job.done) == ("completed", 12)
    assert_exactly_once(pg_url, job_id, 12)


def test_messages_of_the_old_format_still_run(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    """(job id, [item ids]), as queued before an upgrade."""
    job_id = stored_job(
        pg_url, queue_name, prompts_file(tmp_path / "p.jsonl", [f"old {i}" for i in range(6)])
    )
    with session_scope(pg_url) as session:
        ids = list(session.scalars(select(Item.id).where(Item.job_id == job_id).order_by(Item.seq)))
        session.execute(update(Job).where(Job.id == job_id).values(queued_seq=6))
    app = producer_app(service_env(pg_url, queue_name)["GENJOB_BROKER_URL"])
    for chunk in (ids[:4], ids[4:]):
        app.send_task(TASK_GENERATE_CHUNK, args=(job_id, chunk), queue=queue_name)
    start_worker(f"{queue_name}-a", service_env(pg_url, queue_name, **FAST_RECOVERY))
    job = wait_for_job_end(pg_url, job_id, timeout=90)
    assert (job.status, job.done) == ("completed", 6)
    assert_exactly_once(pg_url, job_id, 6)


def test_a_small_job_is_not_stuck_behind_a_huge_one_on_the_same_queue(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    env = service_env(pg_url, queue_name, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", env)
    big = submit(
        env,
        prompts_file(tmp_path / "big.jsonl", [f"big {i} sleep=0.1" for i in range(80)]),
        "--chunk-size",
        "4",
    )
    wait_for(lambda: job_row(pg_url, big).done >= 1, timeout=90, what="the big job to start")
    small = submit(env, prompts_file(tmp_path / "small.jsonl", [f"small {i}" for i in range(10)]))
    job = wait_for_job_end(pg_url, small, timeout=90)
    assert job.status == "completed"
    queued_at = job.queue_progress_at  # when its message was in the queue
    with session_scope(pg_url) as session:
        small_start = session.scalar(select(Item.started_at).where(Item.job_id == small, Item.seq == 0))
        big_chunk_starts = session.scalars(
            select(Item.started_at).where(Item.job_id == big, Item.seq % 4 == 0, Item.started_at.is_not(None))
        ).all()
    between = [started for started in big_chunk_starts if queued_at < started < small_start]
    # one worker: at most the big job's chunk it had already fetched went first, never two
    assert len(between) <= 1, (queued_at, small_start, sorted(big_chunk_starts), worker.log()[-2000:])
    assert job_row(pg_url, big).status == "running"  # the small job did not wait for the big one
    run_cli(env, "cancel", big)
