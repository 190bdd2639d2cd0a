"""`genjob flower` beside a real `genjob worker`: Flower's HTTP API sees the worker online and the
job's chunk tasks (readable name, job id in the arguments) succeed; a chunk with a failed item is a
FAILURE (its Failed filter, the worker's Failed count) with its counts, and is not run again."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import pytest

from tests.support.databases import REDIS_URL
from tests.support.processes import GENJOB, ServiceProcess, WorkerProcess, free_port, run_cli, service_env
from tests.support.prompts import prompts_file
from tests.support.waiting import NOT_UP, wait_for

pytestmark = pytest.mark.integration

FLOWER_USER = ("ops", "s3cret")


def test_flower_watches_the_worker_and_its_tasks(
    pg_url: str, queue_name: str, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, draft = tiny_pair
    env = service_env(pg_url, queue_name)
    worker_name = f"{queue_name}@{socket.gethostname()}"
    port = free_port()
    flower_argv = [GENJOB, "flower", "--port", str(port), f"--basic-auth={':'.join(FLOWER_USER)}"]
    flower = httpx.Client(base_url=f"http://127.0.0.1:{port}", auth=FLOWER_USER, timeout=10)

    with ServiceProcess(flower_argv, env, tmp_path / "flower.log"):
        wait_for(
            lambda: flower.get("/healthcheck").status_code == 200, timeout=60, what="Flower", tolerate=NOT_UP
        )
        assert httpx.get(f"http://127.0.0.1:{port}/api/workers", timeout=10).status_code == 401
        with WorkerProcess(queue_name, env, tmp_path / "worker.log", genjob=[GENJOB]):
            alive = wait_for(
                lambda: flower.get("/api/workers", params={"status": 1}).json().get(worker_name),
                timeout=90,
                what=f"worker {worker_name} online in Flower",
                tolerate=NOT_UP,
            )
            assert alive is True
            inspected = flower.get("/api/workers", params={"refresh": 1, "workername": worker_name}).json()
            assert [q["name"] for q in inspected[worker_name]["active_queues"]] == [queue_name]

            path = prompts_file(tmp_path / "p.jsonl", [f"def f{i}(x):" for i in range(6)], id_format="q{}")
            model = ["-m", str(target), "-a", str(draft)]
            submitted = run_cli(
                env, "submit", str(path), *model, "--chunk-size", "2", "--max-new-tokens", "8", check=True
            )
            job_id = submitted.stdout.strip()

            def job_tasks() -> dict[str, dict]:
                tasks = flower.get(
                    "/api/tasks", params={"workername": worker_name, "taskname": "genjob.generate_chunk"}
                ).json()
                return {
                    task_id: task for task_id, task in tasks.items() if job_id in (task.get("args") or "")
                }

            tasks = wait_for(
                lambda: (
                    (found := job_tasks())
                    and len(found) == 3
                    and all(t["state"] == "SUCCESS" for t in found.values())
                    and found
                ),
                timeout=180,
                what="the job's 3 chunk tasks to succeed in Flower",
            )
            _a_chunk_with_a_failed_item_is_a_failure(
                flower, worker_name, pg_url, queue_name, tiny_pair, tmp_path
            )
    assert {task["name"] for task in tasks.values()} == {"genjob.generate_chunk"}
    assert {task["worker"] for task in tasks.values()} == {worker_name}
    assert sorted(task["args"] for task in tasks.values()) == [
        f"job={job_id} items 0-1",
        f"job={job_id} items 2-3",
        f"job={job_id} items 4-5",
    ]
    assert {json.loads(task["result"].replace("'", '"'))["chunk"] for task in tasks.values()} == {"clean"}
    assert sorted(json.loads(task["result"].replace("'", '"'))["done"] for task in tasks.values()) == [
        2,
        2,
        2,
    ]


def _a_chunk_with_a_failed_item_is_a_failure(
    flower: httpx.Client,
    worker_name: str,
    pg_url: str,
    queue: str,
    tiny_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """One chunk of two items, one of which cannot run (600 new tokens past the tiny model's context
    of 512: stored without submit's context check, so that the worker meets it): Flower lists the
    chunk as FAILURE with its counts, counts it in the worker's Failed, and the chunk runs once."""
    from genjob.catalog import job_spec, parse_job_options
    from genjob.db import session_scope
    from genjob.settings import Settings
    from genjob.submit import store_job
    from genjob.tables import Job
    from genjob.worker.enqueue import enqueue_job

    target, draft = tiny_pair
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, queue=queue)
    options = parse_job_options({"model": str(target), "assistant": str(draft), "max_new_tokens": 8})
    path = tmp_path / "failing.jsonl"
    path.write_text('{"prompt": "def g(x):"}\n{"prompt": "def h(x):", "max_new_tokens": 600}\n', "utf-8")
    job_id = store_job(settings, path=path, spec=job_spec(settings, options, allow_paths=True)).job_id
    enqueue_job(settings, job_id=job_id, chunk_size=2)

    def failed_chunks() -> list[dict]:
        tasks = flower.get("/api/tasks", params={"workername": worker_name, "state": "FAILURE"}).json()
        return [task for task in tasks.values() if job_id in (task.get("args") or "")]

    (task,) = wait_for(failed_chunks, timeout=180, what="the failing chunk to be a FAILURE in Flower")
    assert task["args"] == f"job={job_id} items 0-1"
    assert task["exception"] == (
        "ChunkNotClean({'chunk': 'WITH FAILURES', 'done': 1, 'failed': 1, 'skipped': 0})"
    )
    counters = flower.get("/workers", params={"json": 1}).json()["data"]
    (mine,) = [worker for worker in counters if worker["hostname"] == worker_name]
    assert (mine["task-failed"], mine["task-succeeded"]) == (1, 3)
    assert mine.get("task-retried", 0) == 0
    with session_scope(pg_url) as session:
        job = session.get(Job, job_id)
        assert (job.status, job.done, job.failed) == ("completed", 1, 1)
    every = flower.get("/api/tasks", params={"workername": worker_name}).json()
    assert [t["state"] for t in every.values() if job_id in (t.get("args") or "")] == ["FAILURE"]
