"""Keys own what they make: another key gets 404 (job, results, file, batch, prefixes), an admin key sees
all (the CLI's jobs too), no server path in any answer, the docs take the key, usage and the quota."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from genjob import store
from genjob.api.app import create_app
from genjob.api.deps import owner_of_key
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.submit import store_job
from genjob.tables import Job
from tests.support.api import jsonl, run_pending_here, with_settings
from tests.support.specs import build_job_spec

PROMPTS = [{"prompt": "def f(x):", "id": "a"}, {"prompt": "import os"}]
BATCH_LINES = [{"custom_id": "r1", "body": {"model": "tiny", "prompt": "def g():", "max_tokens": 2}}]


@pytest.fixture
def keys() -> dict[str, str]:
    """Keys of this test's own (the session's database holds every earlier test's jobs)."""
    tag = uuid.uuid4().hex[:12]
    return {"a": f"a-key-{tag}", "b": f"b-key-{tag}", "admin": f"admin-key-{tag}"}


@pytest.fixture
def tenant_settings(api_settings: Settings, keys: dict[str, str]) -> Settings:
    return with_settings(api_settings, api_keys=(keys["a"], keys["b"]), admin_api_keys=(keys["admin"],))


@pytest.fixture
def clients(tenant_settings: Settings, keys: dict[str, str]) -> Iterator[dict[str, TestClient]]:
    app = create_app(tenant_settings)
    with TestClient(app) as anonymous:
        yield {
            name: TestClient(app, headers={"Authorization": f"Bearer {key}"}) for name, key in keys.items()
        } | {"anonymous": anonymous}


def submit(client: TestClient, **params) -> dict:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny", "max_new_tokens": 3, **params},
        files={"file": ("p.jsonl", jsonl(PROMPTS))},
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_another_key_gets_404_for_jobs_results_and_prefixes(
    clients: dict[str, TestClient], keys: dict[str, str]
) -> None:
    a, b, admin = clients["a"], clients["b"], clients["admin"]
    job = submit(a)
    assert job["owner"] == owner_of_key(keys["a"])
    one_character = b.get(f"/v1/jobs/{job['id'][:1]}")  # 404, or one of B's own jobs: never A's
    assert one_character.status_code == 404 or one_character.json()["owner"] == owner_of_key(keys["b"])
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/results", f"/v1/jobs/{job['id'][:8]}"):
        assert b.get(path).status_code == 404, path
        assert a.get(path).status_code == 200, path
        assert admin.get(path).status_code == 200, path
    for action in ("cancel", "requeue"):
        assert b.post(f"/v1/jobs/{job['id']}/{action}").json()["error"]["code"] == "not_found"
    assert job["id"] not in [j["id"] for j in b.get("/v1/jobs", params={"limit": 200}).json()["data"]]
    assert job["id"] in [j["id"] for j in admin.get("/v1/jobs", params={"limit": 200}).json()["data"]]
    assert a.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"


def test_a_prefix_resolves_within_the_owners_jobs(clients: dict[str, TestClient]) -> None:
    """Two owners' jobs sharing a first character: each one's prefix finds only its own."""
    a, b = clients["a"], clients["b"]
    mine, theirs = submit(a), submit(b)
    while theirs["id"][0] != mine["id"][0]:  # a 1-in-16 chance each: keep submitting until they share one
        theirs = submit(b)
    assert a.get(f"/v1/jobs/{mine['id'][0]}").json()["id"] == mine["id"]
    assert b.get(f"/v1/jobs/{theirs['id'][0]}").json()["id"] == theirs["id"]


def test_cli_jobs_belong_to_local_which_admin_keys_see(
    clients: dict[str, TestClient], tenant_settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl(PROMPTS))
    spec = build_job_spec(tenant_settings, allow_paths=True, model="tiny")
    job_id = store_job(tenant_settings, path=path, spec=spec).job_id
    with session_scope(tenant_settings.database_url) as session:
        assert session.get(Job, job_id).owner == "local"
    assert clients["a"].get(f"/v1/jobs/{job_id}").status_code == 404
    seen = clients["admin"].get(f"/v1/jobs/{job_id}").json()
    assert (seen["owner"], seen["model"]) == ("local", "target")  # a path is shown by its last part only


def test_no_server_paths_in_answers(clients: dict[str, TestClient], tenant_settings: Settings) -> None:
    a = clients["a"]
    job = submit(a)
    run_pending_here(tenant_settings, job["id"])
    target, draft = tenant_settings.model_entry("tiny").target, tenant_settings.model_entry("tiny").draft
    answers = [
        a.get(f"/v1/jobs/{job['id']}").text,
        a.get("/v1/jobs").text,
        a.get(f"/v1/jobs/{job['id']}/results", params={"format": "openai"}).text,
        a.get(f"/v1/jobs/{job['id']}/results").text,
    ]
    for text in answers:
        assert target not in text and draft not in text and "/tmp/" not in text


def test_files_and_batches_are_the_owners(clients: dict[str, TestClient]) -> None:
    a, b, admin = clients["a"], clients["b"], clients["admin"]
    upload = a.post("/v1/files", data={"purpose": "batch"}, files={"file": ("b.jsonl", jsonl(BATCH_LINES))})
    file_id = upload.json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    assert b.post("/v1/batches", json=body).status_code == 404  # another's file cannot feed a batch
    batch = a.post("/v1/batches", json=body).json()
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content", f"/v1/batches/{batch['id']}"):
        assert b.get(path).status_code == 404, path
        assert admin.get(path).status_code == 200, path
    assert b.delete(f"/v1/files/{file_id}").status_code == 404
    assert b.post(f"/v1/batches/{batch['id']}/cancel").status_code == 404
    assert b.get("/v1/files").json()["data"] == []
    assert b.get("/v1/batches").json()["data"] == []
    assert [f["id"] for f in a.get("/v1/files").json()["data"]] == [file_id]  # only A's, newest first
    job_id = batch["genjob"]["job_id"]
    assert b.get(f"/v1/jobs/{job_id}").status_code == 404
    assert a.get(f"/v1/jobs/{job_id}").json()["name"] == batch["id"]  # a batch is a job


@pytest.mark.parametrize("path", ["/v1/batches/batch_nope", "/v1/files/file-nope", "/v1/files/x/content"])
def test_unknown_ids_are_404(clients: dict[str, TestClient], path: str) -> None:
    assert clients["a"].get(path).json()["error"]["code"] == "not_found"


def test_docs_and_the_spec_take_the_key(clients: dict[str, TestClient]) -> None:
    for path in ("/openapi.json", "/docs"):
        assert clients["anonymous"].get(path).status_code == 401
        assert clients["a"].get(path).status_code == 200
    spec = clients["a"].get("/openapi.json").json()
    assert {"/v1/files", "/v1/batches", "/v1/batches/{batch_id}/cancel", "/v1/usage"} <= set(spec["paths"])
    assert "GENJOB_API_HEADER_TIMEOUT_S" in spec["info"]["description"]
    assert "swagger" in clients["a"].get("/docs").text.lower()


def test_usage_per_key_and_the_quota(
    clients: dict[str, TestClient], tenant_settings: Settings, keys: dict[str, str]
) -> None:
    a, b, admin = clients["a"], clients["b"], clients["admin"]

    def usage(client: TestClient) -> tuple[str, int, int, int, int]:
        (row,) = client.get("/v1/usage", params={"days": 1}).json()["data"]
        return row["owner"], row["jobs"], row["requests"], row["prompt_tokens"], row["completion_tokens"]

    before, others = usage(a), usage(b)
    job = submit(a)
    run_pending_here(tenant_settings, job["id"])
    after = usage(a)
    assert after[0] == owner_of_key(keys["a"])
    assert (after[1] - before[1], after[2] - before[2], after[4] - before[4]) == (1, 2, 6)
    assert after[3] > before[3]
    assert usage(b) == others
    owners = {u["owner"] for u in admin.get("/v1/usage").json()["data"]}
    assert owner_of_key(keys["a"]) in owners

    limited = create_app(with_settings(tenant_settings, **{"api_quota_tokens": 5}))
    with TestClient(limited, headers={"Authorization": f"Bearer {keys['a']}"}) as over:
        refused = over.post("/v1/jobs", params={"model": "tiny"}, files={"file": ("p.jsonl", jsonl(PROMPTS))})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "quota_exceeded"
    with TestClient(limited, headers={"Authorization": f"Bearer {keys['b']}"}) as fresh:
        assert (
            fresh.post(
                "/v1/jobs", params={"model": "tiny"}, files={"file": ("p.jsonl", jsonl(PROMPTS))}
            ).status_code
            == 201
        )
    with session_scope(tenant_settings.database_url) as session:
        assert store.get_job(session, job_id=job["id"], owner=owner_of_key(keys["a"])).done == 2


def test_server_wide_metrics_need_an_admin_key_where_admins_are_configured(
    clients: dict[str, TestClient],
) -> None:
    refused = clients["a"].get("/metrics")
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        403,
        "server-wide figures need an admin key (GENJOB_ADMIN_API_KEYS)",
    )
    assert clients["admin"].get("/metrics").status_code == 200
