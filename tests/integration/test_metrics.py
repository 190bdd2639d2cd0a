"""Prometheus metrics of a real worker (`genjob worker --metrics-port`, multiprocess mode): scraped while
a job runs, the series move; across many jobs they stay the same set (no job ids in labels). The model
is labelled by its catalog name; tokens per second, item latency, rows per round, the runner's set-up
time and the build's version are there as an operator graphs them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from genjob import __version__
from tests.support.jobs import job_row, wait_for_job_end
from tests.support.processes import FAST_RECOVERY, free_port, service_env, submit
from tests.support.prompts import prompts_file
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("genjob_")
    }


def total(values: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, labelset), v in values.items() if n == name and wanted <= labelset)


def test_worker_metrics_move_during_a_job_and_stay_bounded(
    pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> None:
    port = free_port()
    models = json.dumps({"fast": {"target": "scripted"}})  # the scripted stand-in, by a catalog name
    env = service_env(pg_url, queue_name, **FAST_RECOVERY, metrics_port=str(port), models=models)
    start_worker(f"{queue_name}-a", env)
    url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: _get(url) is not None, timeout=60, what="the metrics endpoint")
    job_id = submit(env, prompts_file(tmp_path / "p.jsonl", [f"p{i} sleep=0.2" for i in range(15)]))

    def done_while_running() -> float:
        value = total(samples(_get(url) or ""), "genjob_items_total", state="done")
        return value if 0 < value < 15 and job_row(pg_url, job_id).status == "running" else 0

    first = wait_for(done_while_running, timeout=60, what="items counted while the job runs")
    wait_for(
        lambda: total(samples(_get(url) or ""), "genjob_tokens_per_second") > 0,
        timeout=60,
        what="tokens per second while the job runs",
    )
    wait_for(lambda: done_while_running() > first, timeout=60, what="the count to move on")
    wait_for_job_end(pg_url, job_id)
    after_one = samples(_get(url) or "")
    assert total(after_one, "genjob_items_total", state="done") == 15
    assert total(after_one, "genjob_new_tokens_total") == 15
    assert total(after_one, "genjob_rounds_total") == 15
    assert total(after_one, "genjob_round_seconds_count") == 15
    assert total(after_one, "genjob_chunks_total", outcome="clean") == 1
    assert total(after_one, "genjob_item_seconds_count", model="fast", mode="none") == 15
    assert total(after_one, "genjob_round_rows_count") == 15
    assert total(after_one, "genjob_round_rows_sum") == 15  # one row a round: batch size 1
    assert total(after_one, "genjob_model_load_seconds_count", model="fast", mode="none") == 1
    assert total(after_one, "genjob_tokens_per_second", model="fast") == 0  # idle once the chunk ended
    assert total(after_one, "genjob_build_info", version=__version__) == 1
    assert {dict(labelset)["model"] for _, labelset in after_one if "model" in dict(labelset)} == {"fast"}

    for n in range(4):
        more = submit(env, prompts_file(tmp_path / f"more{n}.jsonl", ["a", "b"]))
        wait_for_job_end(pg_url, more)
    text = _get(url) or ""
    after_five = samples(text)
    assert set(after_five) == set(after_one)  # more jobs, the same series
    assert total(after_five, "genjob_items_total", state="done") == 23
    assert job_id not in text and more not in text
    labels = {name for _, labelset in after_five for name, _ in labelset}
    assert labels <= {"model", "queue", "mode", "worker", "state", "outcome", "le", "pid", "version"}
    # pid only on the pool processes' progress gauges (one series each, dead processes left out)
    assert {n for n, labelset in after_five if "pid" in dict(labelset)} == {
        "genjob_worker_progress_timestamp_seconds",
        "genjob_worker_holding_chunk",
        "genjob_worker_stall_bound_seconds",
    }
    assert total(after_five, "genjob_worker_holding_chunk") == 0  # idle: it holds nothing


def _get(url: str) -> str | None:
    try:
        response = httpx.get(url, timeout=5)
    except httpx.TransportError:
        return None
    return response.text if response.status_code == 200 else None
