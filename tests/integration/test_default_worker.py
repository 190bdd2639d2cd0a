"""`genjob worker` as a user starts it: default settings (no GENJOB_TORCH_THREADS), the real demo pair,
real Postgres, Redis and Celery; and what its main process may do before Celery forks the pool.

A torch operation in the main process before the fork starts torch's OpenMP thread pool, which does not
survive ``fork``: the pool child's first multi-threaded op then blocks forever (this happened: the
device check ran a matmul there). CUDA refuses a child forked after its context exists.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import openai
import pytest

from genjob.worker.main import usable_cores
from tests.support.processes import (
    GENJOB,
    ServiceProcess,
    WorkerProcess,
    free_port,
    run_cli,
    service_env,
    wait_until_serving,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"

# The worker's main process, recording every torch function it runs until its first fork.
RECORDING_WORKER = r"""
import json, os, sys
import torch
from torch.overrides import TorchFunctionMode

calls = []


class Record(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.device:  # a device object (imports make some) runs nothing
            calls.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


Record().__enter__()
report, queue = sys.argv[1], sys.argv[2]


def before_fork():
    if not os.path.exists(report):
        with open(report, "w") as out:
            json.dump({"pid": os.getpid(), "calls": calls, "cuda": torch.cuda.is_initialized()}, out)


os.register_at_fork(before=before_fork)
from genjob.cli import main

sys.argv = ["genjob", "worker", "-Q", queue, "-c", "1"]
main()
"""


def default_env(pg_url: str, queue: str, **settings: str) -> dict[str, str]:
    """A user's environment: the broker and database, nothing that only makes tests work."""
    return service_env(pg_url, queue, torch_threads=None, **settings)


def completed_batch(sdk: openai.OpenAI, body: bytes, endpoint: str, count: int, log: Path) -> list[dict]:
    """files.create → batches.create on ``endpoint`` → completed with ``count`` requests done: the
    output file's lines (the worker's ``log`` in any failed assertion)."""
    uploaded = sdk.files.create(file=("requests.jsonl", body), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")
    ended = wait_for(
        lambda: (b := sdk.batches.retrieve(batch.id)).status in ("completed", "failed", "expired") and b,
        timeout=300,
        what="the batch",
    )
    assert ended.status == "completed", log.read_text()
    assert ended.request_counts is not None and ended.request_counts.completed == count, log.read_text()
    assert ended.output_file_id is not None
    return [json.loads(line) for line in sdk.files.content(ended.output_file_id).text.splitlines()]


def test_the_main_process_runs_no_torch_op_before_the_pool_forks(
    pg_url: str, queue_name: str, tmp_path: Path
) -> None:
    report = tmp_path / "fork.json"
    argv = [sys.executable, "-c", RECORDING_WORKER, str(report), queue_name]
    with ServiceProcess(argv, default_env(pg_url, queue_name), tmp_path / "worker.log") as process:
        wait_for(lambda: report.exists() or process.poll() is not None, timeout=120, what="the pool's fork")
        log = process.log()
        assert report.exists(), log
        seen = json.loads(report.read_text())
    assert seen["calls"] == [], f"torch ran in the worker's main process before it forked: {seen['calls']}"
    assert seen["cuda"] is False
    probed = next(line for line in log.splitlines() if "ran in a process of its own" in line)
    assert f"({seen['pid']})" not in probed  # the device check ran elsewhere


def test_a_default_worker_runs_a_draft_job_with_the_demo_pair(
    pg_url: str, queue_name: str, tmp_path: Path
) -> None:
    env = default_env(pg_url, queue_name)
    with WorkerProcess(queue_name, env, tmp_path / "worker.log", genjob=[GENJOB]) as worker:
        model = ["-m", str(DEMO / "target"), "-a", str(DEMO / "draft")]
        examples = str(ROOT / "examples" / "prompts.jsonl")
        submitted = run_cli(env, "submit", examples, *model, "--max-new-tokens", "16", "--wait", timeout=300)
        log = worker.log()
    assert submitted.returncode == 0, submitted.stderr + log
    assert "completed: 12 done, 0 failed of 12" in submitted.stderr
    cores = usable_cores()
    assert f"torch threads per pool process: {cores} ({cores} cores ÷ 1)" in log


def test_the_openai_sdk_flow_on_a_fresh_default_worker(pg_url: str, queue_name: str, tmp_path: Path) -> None:
    """files.create → batches.create → completed, on `genjob api` and a fresh `genjob worker` (default
    settings, an empty cost cache) running the demo pair from the allow-list."""
    models = json.dumps({"demo": {"target": str(DEMO / "target"), "draft": str(DEMO / "draft")}})
    env = default_env(pg_url, queue_name, models=models, api_keys="k", cost_cache_dir=str(tmp_path / "costs"))
    port = free_port()
    with (
        WorkerProcess(queue_name, env, tmp_path / "worker.log", genjob=[GENJOB]),
        ServiceProcess([GENJOB, "api", "--port", str(port)], env, tmp_path / "api.log"),
    ):
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base)
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k")
        requests = [
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "demo", "prompt": f"def function_{i}(x):", "max_tokens": 24},
            }
            for i in range(6)
        ]
        body = "".join(json.dumps(line) + "\n" for line in requests).encode()
        lines = completed_batch(sdk, body, "/v1/completions", 6, tmp_path / "worker.log")
        assert sorted(line["custom_id"] for line in lines) == [f"r{i}" for i in range(6)]
        assert all(line["response"]["status_code"] == 200 for line in lines)


def _first_lines(path: Path, count: int, max_tokens: int) -> bytes:
    """The first ``count`` OpenAI lines of an example job, each asking for ``max_tokens`` at most."""
    lines = [json.loads(line) for line in path.read_text().splitlines()[:count]]
    for line in lines:
        line["body"]["max_tokens"] = max_tokens
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def test_the_real_model_through_submit_and_the_openai_sdk(
    pg_url: str, queue_name: str, tmp_path: Path, smollm2_checkpoint: str
) -> None:
    """The built-in smollm2 (a GGUF in its package, converted once into the default model cache) on a
    fresh default worker: `genjob submit --input-format openai -m smollm2`, and the SDK's Batches flow
    with `"model": "smollm2"`; chat lines rendered by its template, ending at its `<|im_end|>`."""
    env = default_env(pg_url, queue_name, api_keys="k", cost_cache_dir=str(tmp_path / "costs"))
    jobs = tmp_path / "rewrite.jsonl"
    jobs.write_bytes(_first_lines(ROOT / "examples" / "rewrite.jsonl", 3, 48))
    port = free_port()
    with (
        WorkerProcess(queue_name, env, tmp_path / "worker.log", genjob=[GENJOB]) as worker,
        ServiceProcess([GENJOB, "api", "--port", str(port)], env, tmp_path / "api.log"),
    ):
        options = ["--input-format", "openai", "-m", "smollm2", "--mode", "prompt-lookup", "--wait"]
        submitted = run_cli(env, "submit", str(jobs), *options, timeout=300)
        assert submitted.returncode == 0, submitted.stderr + worker.log()
        assert "completed: 3 done, 0 failed of 3" in submitted.stderr
        results = run_cli(env, "results", submitted.stdout.strip(), check=True)
        rows = [json.loads(line) for line in results.stdout.splitlines()]
        assert [row["status"] for row in rows] == ["done"] * 3
        assert all("def " in row["output"] and "<|im_end|>" not in row["output"] for row in rows), rows

        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base)
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="k")
        body = _first_lines(ROOT / "examples" / "classify.jsonl", 4, 8)
        lines = completed_batch(sdk, body, "/v1/chat/completions", 4, tmp_path / "worker.log")
        responses = [line["response"] for line in lines]
        assert all(response["status_code"] == 200 for response in responses), lines
        choices = [response["body"]["choices"][0] for response in responses]
        assert all(choice["message"]["role"] == "assistant" for choice in choices), lines
        assert all(choice["message"]["content"].strip() for choice in choices), lines
        assert {response["body"]["model"] for response in responses} == {"smollm2"}
