"""A sticky device error (CUDA's illegal memory access, here the scripted stand-in's synthetic one) on a
real worker, Redis and Postgres: the pool process gives its items back, their try counted, and exits;
Celery starts a fresh one, which finishes the job. The rest is real (tests/doubles/model_doubles.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from genjob.db import session_scope
from genjob.tables import Attempt, Item
from tests.doubles.model_doubles import ILLEGAL_ADDRESS
from tests.support.jobs import assert_exactly_once, wait_for_job_end
from tests.support.processes import FAST_RECOVERY, service_env, submit
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def test_a_sticky_cuda_error_gives_the_items_back_and_the_pool_process_is_replaced(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    env = service_env(pg_url, queue_name, **FAST_RECOVERY)
    worker = start_worker(f"{queue_name}-a", env)
    marker = tmp_path / "broken-pid"
    prompts = ["item 0", f"item 1 cuda-error-once={marker}", "item 2", "item 3"]
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", prompts), "--chunk-size", "4")
    job = wait_for_job_end(pg_url, job_id, timeout=120)
    assert (job.status, job.done, job.failed) == ("completed", 4, 0)
    assert_exactly_once(pg_url, job_id, 4)
    broken = int(marker.read_text())
    wait_for(lambda: broken not in worker.children(), timeout=30, what="the broken process gone")
    assert worker.poll() is None and worker.children()  # the worker lives on, a fresh pool process in it
    error = "RuntimeError: " + ILLEGAL_ADDRESS
    with session_scope(pg_url) as session:
        lost = session.execute(
            select(Item.seq, Attempt.error)
            .join(Item, Item.id == Attempt.item_id)
            .where(Attempt.job_id == job_id, Attempt.outcome == "lost")
        ).all()
        attempts = dict(session.execute(select(Item.seq, Item.attempts).where(Item.job_id == job_id)).all())
    assert lost and all(text == error for _, text in lost)  # given back, each try counted, with the error
    assert 1 in {seq for seq, _ in lost}
    assert attempts[1] == 2  # the broken process's try, then the fresh process's
    log = worker.log()
    assert "the device is unusable in this process; it exits" in log
    assert "a batch failed" not in log  # not taken for a poison batch: nothing ran alone on that device
