"""Property-based: schemathesis drives every operation of the API's own OpenAPI spec, with valid and
invalid inputs (and valid uploads, so the 201 path runs too); no request may answer 500."""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from genjob.api.app import create_app
from genjob.settings import Settings
from tests.support.api import AUTH, jsonl

# The raw JSONL body is bytes on the wire, like application/octet-stream.
schemathesis.serializer.alias("application/jsonl", "application/octet-stream")

CASES_PER_OPERATION = 25  # about 200 requests in all, well under a minute
VALID_UPLOAD = jsonl([{"prompt": "def f(x):", "id": "a"}, {"prompt": "import os"}])


def case_strategies(operation, job_id: str, ids: dict[str, str]) -> st.SearchStrategy:
    """Valid and invalid cases, plus ones that reach the success paths: a good upload, a real job."""
    strategies = [
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    ]
    if operation.method.upper() == "POST" and operation.path == "/v1/jobs":
        strategies.append(
            operation.as_strategy(query={"model": "tiny"}, body=VALID_UPLOAD, media_type="application/jsonl")
        )
    if "{job_id}" in operation.path:
        strategies.append(operation.as_strategy(path_parameters={"job_id": job_id}))
    if "{file_id}" in operation.path:
        strategies.append(operation.as_strategy(path_parameters={"file_id": ids["file"]}))
    if "{batch_id}" in operation.path:
        strategies.append(operation.as_strategy(path_parameters={"batch_id": ids["batch"]}))
    if operation.method.upper() == "POST" and operation.path == "/v1/batches":
        body = {"input_file_id": ids["batch_file"], "endpoint": "/v1/completions", "completion_window": "24h"}
        strategies.append(operation.as_strategy(body=body))
    return st.one_of(strategies)


def test_no_server_errors(api_settings: Settings) -> None:
    app = create_app(api_settings)
    upload = TestClient(app, headers=AUTH).post(
        "/v1/jobs", params={"model": "tiny"}, files={"file": ("p.jsonl", VALID_UPLOAD)}
    )
    job_id = upload.json()["id"]
    client = TestClient(app, headers=AUTH)
    batch_lines = jsonl(
        [{"custom_id": "a", "body": {"model": "tiny", "prompt": "def f(x):", "max_tokens": 2}}]
    )
    file_ids = [
        client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", batch_lines)}).json()[
            "id"
        ]
        for _ in range(2)
    ]
    body = {"input_file_id": file_ids[1], "endpoint": "/v1/completions", "completion_window": "24h"}
    batch_id = client.post("/v1/batches", json=body).json()["id"]
    ids = {"file": file_ids[0], "batch_file": file_ids[1], "batch": batch_id}  # the first may be deleted
    assert TestClient(app).get("/openapi.json").status_code == 401  # the spec takes the key too
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} == {
        "GET /healthz",
        "POST /v1/jobs",
        "GET /v1/jobs",
        "GET /v1/jobs/{job_id}",
        "GET /v1/jobs/{job_id}/results",
        "POST /v1/jobs/{job_id}/cancel",
        "POST /v1/jobs/{job_id}/requeue",
        "GET /metrics",
        "POST /v1/files",
        "GET /v1/files",
        "GET /v1/files/{file_id}",
        "GET /v1/files/{file_id}/content",
        "DELETE /v1/files/{file_id}",
        "POST /v1/batches",
        "GET /v1/batches",
        "GET /v1/batches/{batch_id}",
        "POST /v1/batches/{batch_id}/cancel",
        "GET /v1/usage",
    }
    statuses: dict[str, set[int]] = {}
    for operation in operations:

        @given(case=case_strategies(operation, job_id, ids))
        @settings(
            max_examples=CASES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case) -> None:
            response = case.call_and_validate(headers=AUTH, checks=[not_a_server_error])
            statuses.setdefault(case.operation.label, set()).add(response.status_code)

        run()
    assert 201 in statuses["POST /v1/jobs"], statuses
    assert 200 in statuses["GET /v1/jobs/{job_id}/results"], statuses
    assert 200 in statuses["POST /v1/batches"], statuses
