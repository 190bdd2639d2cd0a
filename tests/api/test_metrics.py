"""``GET /metrics`` on the API: requests by route template, jobs submitted by model (batches too), jobs by
status, open items and queue depth from the database and the broker, uploads being received, the build's
version; behind the API key; no job ids in labels."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from genjob import __version__
from tests.support.api import jsonl


def values(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_api_metrics(client: TestClient, queue_name: str) -> None:
    body = jsonl([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}])
    job_id = client.post(
        "/v1/jobs", params={"model": "tiny"}, content=body, headers={"Content-Type": "application/jsonl"}
    ).json()["id"]
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    metrics = values(response.text)
    assert metrics[("genjob_api_jobs_submitted_total", (("model", "tiny"),))] == 1
    route = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "200"))
    assert metrics[("genjob_api_requests_total", route)] == 1
    assert metrics[("genjob_jobs", (("status", "queued"),))] >= 1
    assert metrics[("genjob_open_items", (("queue", queue_name), ("state", "pending")))] == 3
    assert metrics[("genjob_queue_depth", (("queue", queue_name),))] == 2  # chunks of 2
    assert metrics[("genjob_api_uploads_receiving", ())] == 0  # the upload ended with its request
    assert job_id not in response.text
    client.post(f"/v1/jobs/{job_id}/cancel")


def test_metrics_need_the_api_key(client: TestClient) -> None:
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401


def test_batches_count_as_submitted_jobs_and_the_build_is_named(client: TestClient) -> None:
    lines = jsonl([{"custom_id": "a", "body": {"model": "tiny", "prompt": "p", "max_tokens": 2}}])
    upload = client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", lines)})
    body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
    made = client.post("/v1/batches", json=body, headers={"Idempotency-Key": "metrics-1"})
    again = client.post("/v1/batches", json=body, headers={"Idempotency-Key": "metrics-1"})
    assert made.json()["id"] == again.json()["id"]  # a replay makes no second job
    metrics = values(client.get("/metrics").text)
    assert metrics[("genjob_api_jobs_submitted_total", (("model", "tiny"),))] == 1
    assert metrics[("genjob_build_info", (("version", __version__),))] == 1
    client.post(f"/v1/batches/{made.json()['id']}/cancel")
