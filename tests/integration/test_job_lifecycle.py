"""Job lifecycles on two real workers sharing one queue: poison items and `genjob retry`, cancel,
expiry, no two attempts of an item at once, and a large job drained through the real pipeline.

The models are replaced by the scripted stand-in (tests/doubles/model_doubles.py); Celery, Redis,
Postgres and the CLI are real. The two workers serve every test of this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import Attempt, Item, utcnow
from genjob.worker.enqueue import enqueue_job
from tests.support.databases import REDIS_URL, throwaway_queue
from tests.support.jobs import exactly_once_report, job_row, wait_for_job_end
from tests.support.processes import (
    FAST_RECOVERY,
    WorkerProcess,
    measured_submit,
    run_cli,
    service_env,
    stop_all,
    submit,
)
from tests.support.prompts import prompts_file, write_jsonl
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

# Lines of the large job here (bench/large_job.py does 100,000); the no-op drain dominates its time.
LARGE_JOB = 2000


@pytest.fixture(scope="module")
def queue() -> Iterator[str]:
    with throwaway_queue() as name:
        yield name


@pytest.fixture(scope="module")
def env(pg_url: str, queue: str) -> dict[str, str]:
    return service_env(pg_url, queue, **FAST_RECOVERY)


@pytest.fixture(scope="module")
def workers(env: dict[str, str], queue: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    logs = tmp_path_factory.mktemp("workers")
    started = [WorkerProcess(f"{queue}-{n}", env, logs / f"{n}.log") for n in ("a", "b")]
    yield started
    stop_all(started)


def attempts_of(pg_url: str, job_id: str) -> dict[int, list[Attempt]]:
    """Attempts per item seq, oldest first."""
    with session_scope(pg_url) as session:
        rows = session.execute(
            select(Item.seq, Attempt).join(Attempt, Attempt.item_id == Item.id).where(Item.job_id == job_id)
        ).all()
    by_seq: dict[int, list[Attempt]] = {}
    for seq, attempt in sorted(rows, key=lambda row: (row[0], row[1].started_at)):
        by_seq.setdefault(seq, []).append(attempt)
    return by_seq


def statuses(pg_url: str, job_id: str) -> dict[str, int]:
    with session_scope(pg_url) as session:
        rows = session.execute(
            select(Item.status, func.count()).where(Item.job_id == job_id).group_by(Item.status)
        ).all()
    return dict(rows)


def test_poison_item_is_retried_then_failed_and_genjob_retry_reruns_only_it(
    pg_url: str, env: dict[str, str], workers, tmp_path: Path
) -> None:
    poison = tmp_path / "poison"
    poison.touch()
    prompts = [f"item {i}" + (f" poison-while={poison}" if i == 3 else "") for i in range(10)]
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", prompts), "--chunk-size", "4")

    job = wait_for_job_end(pg_url, job_id)
    assert (job.status, job.done, job.failed) == ("completed", 9, 1)
    tries = attempts_of(pg_url, job_id)
    assert [a.outcome for a in tries[3]] == ["retried", "retried", "failed"]
    assert all([a.outcome for a in tries[seq]] == ["done"] for seq in tries if seq != 3)
    exported = [json.loads(line) for line in run_cli(env, "results", job_id).stdout.splitlines()]
    assert exported[3]["status"] == "failed"
    assert exported[3]["error"] == "PoisonError: poisoned item 3 (attempt 3 of 3)"

    poison.unlink()  # the cause is fixed: a retry now succeeds
    retried = run_cli(env, "retry", job_id)
    assert (retried.returncode, retried.stdout) == (0, f"retrying 1 failed item of job {job_id}\n")
    job = wait_for_job_end(pg_url, job_id)
    assert (job.status, job.done, job.failed) == ("completed", 10, 0)
    tries = attempts_of(pg_url, job_id)
    assert [a.outcome for a in tries[3]] == ["retried", "retried", "failed", "done"]
    assert all(len(tries[seq]) == 1 for seq in tries if seq != 3), "retry re-ran a done item"
    report = exactly_once_report(pg_url, job_id)
    assert (report["results"], report["items_with_one_result"], report["overlapping_attempts"]) == (10, 10, 0)

    again = run_cli(env, "retry", job_id)
    assert (again.returncode, again.stdout) == (0, f"job {job_id} has no failed items: nothing to retry\n")


def test_cancel_a_running_job_stops_at_the_next_item_and_keeps_what_finished(
    pg_url: str, env: dict[str, str], workers, tmp_path: Path
) -> None:
    prompts = [f"item {i} sleep=0.5" for i in range(12)]
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", prompts), "--chunk-size", "12")
    wait_for(lambda: job_row(pg_url, job_id).done >= 3, timeout=90, what="three items done")

    cancelled = run_cli(env, "cancel", job_id)
    assert cancelled.stdout == f"cancelled {job_id}\n"
    cancel_time, done_at_cancel = utcnow(), job_row(pg_url, job_id).done  # the cancel has committed
    # Would a worker start anything more? Not once the task of the job's one chunk has returned.
    ended = f"job {job_id} chunk "  # what a worker logs as a chunk's task returns
    wait_for(lambda: any(ended in w.log() for w in workers), timeout=30, what="the chunk's task to end")

    job = job_row(pg_url, job_id)
    counts = statuses(pg_url, job_id)
    assert job.status == "cancelled"
    assert job.done in (done_at_cancel, done_at_cancel + 1)  # at most the one in flight finished
    assert counts == {"done": job.done, "cancelled": 12 - job.done}
    tries = attempts_of(pg_url, job_id)
    assert all(a.started_at < cancel_time for attempts in tries.values() for a in attempts)
    outcomes = [a.outcome for attempts in tries.values() for a in attempts]  # nothing started after,
    assert outcomes.count("done") == job.done and set(outcomes) <= {"done", "stopped"}  # nothing lost
    report = exactly_once_report(pg_url, job_id)
    assert report["results"] == report["items_with_one_result"] == job.done


def test_expire_after_ends_a_running_job_and_its_unstarted_items(
    pg_url: str, env: dict[str, str], workers, tmp_path: Path
) -> None:
    prompts = [f"item {i} sleep=0.4" for i in range(20)]
    path = prompts_file(tmp_path / "p.jsonl", prompts)
    job_id = submit(env, path, "--chunk-size", "5", "--expire-after", "3s")
    job = wait_for_job_end(pg_url, job_id)
    assert job.status == "expired"
    assert job.error.startswith("expired: not finished by ")
    wait_for(lambda: "running" not in statuses(pg_url, job_id), timeout=30, what="the items in flight to end")
    counts = statuses(pg_url, job_id)
    assert set(counts) == {"done", "expired"} and counts["done"] >= 1
    tries = attempts_of(pg_url, job_id)
    assert all(a.started_at <= job.expires_at for attempts in tries.values() for a in attempts)
    assert exactly_once_report(pg_url, job_id)["results"] == counts["done"]


def test_two_workers_never_run_one_item_at_once_even_with_duplicate_messages(
    pg_url: str, env: dict[str, str], queue: str, workers, tmp_path: Path
) -> None:
    prompts = [f"item {i} sleep=0.05" for i in range(60)]
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", prompts), "--chunk-size", "5")
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, queue=queue)
    for chunk_size in (5, 7, 3):  # every item queued three more times, in chunks that straddle
        enqueue_job(settings, job_id=job_id, chunk_size=chunk_size, everything=True)

    job = wait_for_job_end(pg_url, job_id)
    assert (job.status, job.done) == ("completed", 60)
    report = exactly_once_report(pg_url, job_id)
    assert report["overlapping_attempts"] == 0
    assert (report["results"], report["items_with_one_result"], report["done_attempts"]) == (60, 60, 60)
    workers_used = {a.worker.split("/")[0] for tries in attempts_of(pg_url, job_id).values() for a in tries}
    assert len(workers_used) == 2, "both workers should have taken part"


def test_large_job_submits_in_flat_memory_and_drains_exactly_once(
    pg_url: str, env: dict[str, str], workers, tmp_path: Path
) -> None:
    small = write_jsonl(tmp_path / "small.jsonl", [json.dumps({"prompt": f"p {i}"}) for i in range(50)])
    large = write_jsonl(
        tmp_path / "large.jsonl",
        [json.dumps({"prompt": f"prompt number {i}", "id": f"id-{i}"}) for i in range(LARGE_JOB)],
    )
    small_job, _, small_rss = measured_submit(env, small, "-m", "scripted", "--mode", "none")
    job_id, _, large_rss = measured_submit(env, large, "-m", "scripted", "--mode", "none")
    assert large_rss - small_rss < 16 * 1024, f"submit memory grew {small_rss} → {large_rss} KiB"

    for done_id, total in ((small_job, 50), (job_id, LARGE_JOB)):
        job = wait_for_job_end(pg_url, done_id, timeout=300)
        assert (job.status, job.done, job.failed) == ("completed", total, 0)
    report = exactly_once_report(pg_url, job_id)
    assert report["overlapping_attempts"] == 0
    assert (report["results"], report["items_with_one_result"], report["results_matching_prompt"]) == (
        LARGE_JOB,
        LARGE_JOB,
        LARGE_JOB,
    )
