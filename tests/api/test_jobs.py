"""/v1/jobs through the ASGI app on real Postgres and Redis: submit, list, get, results, cancel."""

from __future__ import annotations

import csv
import io
import json

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from genjob.api.app import create_app
from genjob.db import session_scope
from genjob.options import JobOptions
from genjob.queueing import queue_depths
from genjob.settings import Settings
from genjob.tables import Item
from tests.support.api import jsonl, run_pending_here
from tests.support.databases import REDIS_URL
from tests.support.jobs import stored_counts

PROMPTS = [
    {"prompt": "def foo(x):", "id": "first"},
    {"prompt": "import os", "max_new_tokens": 3},
    {"prompt": "class A:", "id": "third"},
]


def submit(client: TestClient, records: list[dict] = PROMPTS, **params) -> dict:
    params = {"model": "tiny", "max_new_tokens": 5, **params}
    response = client.post("/v1/jobs", params=params, files={"file": ("p.jsonl", jsonl(records))})
    assert response.status_code == 201, response.text
    return response.json()


def test_create_from_a_multipart_upload(client: TestClient, api_settings: Settings, queue_name: str) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny", "max_new_tokens": 5, "name": "multi"},
        files={"file": ("p.jsonl", jsonl(PROMPTS), "application/jsonl")},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert (job["status"], job["total"], job["done"], job["name"], job["mode"]) == (
        "queued",
        3,
        0,
        "multi",
        "auto",
    )
    assert job["model"] == "tiny"  # the allow-list name: never a server path
    assert api_settings.model_entry("tiny").target not in response.text
    assert (job["assistant"], job["spec"]["assistant"]) == ("tiny:draft", "tiny:draft")
    assert api_settings.model_entry("tiny").draft not in response.text
    assert job["spec"]["max_new_tokens"] == 5
    with session_scope(api_settings.database_url) as session:
        items = session.scalars(select(Item).where(Item.job_id == job["id"]).order_by(Item.seq)).all()
        assert [(i.seq, i.line, i.custom_id, i.prompt) for i in items] == [
            (0, 1, "first", "def foo(x):"),
            (1, 2, None, "import os"),
            (2, 3, "third", "class A:"),
        ]
    # Two chunks of at most chunk_size=2 items wait in the job's queue.
    assert queue_depths(REDIS_URL, [queue_name])[queue_name] == 2


def test_create_from_a_jsonl_body(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny-plain"},
        content=jsonl(PROMPTS),
        headers={"Content-Type": "application/jsonl"},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert (job["total"], job["mode"], job["assistant"]) == (3, "auto", None)
    assert job["spec"]["max_new_tokens"] == 128


def test_bad_lines_answer_422_with_line_numbers_and_store_nothing(
    client: TestClient, api_settings: Settings
) -> None:
    before = stored_counts(api_settings.database_url)
    body = b'{"prompt": "ok"}\n{"prompt": "x"\n\n{"id": "x"}\n{"prompt": "a", "max_token": 3}\n'
    response = client.post("/v1/jobs", params={"model": "tiny"}, files={"file": ("bad.jsonl", body)})
    assert response.status_code == 422
    assert response.json() == {
        "error": {
            "code": "invalid_input",
            "message": "bad.jsonl:2: invalid JSON: Expecting ',' delimiter (column 15) (and 2 more); "
            "nothing was stored",
            "details": [
                {"line": 2, "field": None, "message": "invalid JSON: Expecting ',' delimiter (column 15)"},
                {"line": 4, "field": "prompt", "message": "missing required field 'prompt'"},
                {
                    "line": 5,
                    "field": "max_token",
                    "message": "unknown field 'max_token' (allowed: prompt, id, max_new_tokens)",
                },
            ],
        }
    }
    assert stored_counts(api_settings.database_url) == before


def test_an_empty_upload_is_422(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs", params={"model": "tiny"}, content=b"", headers={"Content-Type": "application/jsonl"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["details"] == [
        {
            "line": None,
            "field": None,
            "message": "no prompts found (the file is empty or has only blank lines)",
        }
    ]


def test_over_the_upload_limit_is_413(client: TestClient, api_settings: Settings) -> None:
    before = stored_counts(api_settings.database_url)
    line = json.dumps({"prompt": "x" * 1000}) + "\n"
    big = (line * (api_settings.max_upload_bytes // len(line) + 1)).encode()
    assert len(big) > api_settings.max_upload_bytes

    declared = client.post(
        "/v1/jobs", params={"model": "tiny"}, content=big, headers={"Content-Type": "application/jsonl"}
    )
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "payload_too_large"

    def chunks():  # no Content-Length: the limit is enforced while the body streams in
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    streamed = client.post(
        "/v1/jobs", params={"model": "tiny"}, content=chunks(), headers={"Content-Type": "application/jsonl"}
    )
    assert streamed.status_code == 413
    multipart = client.post("/v1/jobs", params={"model": "tiny"}, files={"file": ("big.jsonl", big)})
    assert multipart.status_code == 413
    assert multipart.json()["error"]["message"] == (
        f"the upload is larger than the limit of {api_settings.max_upload_bytes} bytes "
        "(GENJOB_MAX_UPLOAD_BYTES)"
    )
    assert stored_counts(api_settings.database_url) == before


def test_an_upload_right_at_the_limit_is_accepted(client: TestClient, api_settings: Settings) -> None:
    line = json.dumps({"prompt": "y" * 200}) + "\n"  # fits the tiny model's context (checked at submit)
    body = (line * (api_settings.max_upload_bytes // len(line))).encode()
    body += b" " * (api_settings.max_upload_bytes - len(body))  # trailing blanks are allowed
    assert len(body) == api_settings.max_upload_bytes
    response = client.post("/v1/jobs", params={"model": "tiny"}, files={"file": ("p.jsonl", body)})
    assert response.status_code == 201, response.text


def test_other_media_types_are_415(client: TestClient) -> None:
    response = client.post("/v1/jobs", params={"model": "tiny"}, json=PROMPTS)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_multipart_without_the_file_part(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs", params={"model": "tiny"}, files={"prompts": ("p.jsonl", jsonl(PROMPTS))}
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("unexpected form field 'prompts'")


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        (
            {"model": "gpt-9"},
            "model",
            "unknown model 'gpt-9': models are named from the allow-list, "
            "one of: tiny, tiny-chat, tiny-plain, smollm2",
        ),
        (
            {"model": "tiny", "assistant": "gpt-9"},
            "assistant",
            "unknown assistant model 'gpt-9': models are named from the allow-list, "
            "one of: tiny, tiny-chat, tiny-plain, smollm2",
        ),
        (
            {"model": "tiny", "draft_tokens": 0},
            "draft_tokens",
            "draft_tokens: Input should be greater than or equal to 1",
        ),
        (
            {"model": "tiny", "max_new_tokens": 0},
            "max_new_tokens",
            "max_new_tokens must be between 1 and 8192, got 0",
        ),
        ({"model": "tiny-plain", "mode": "draft"}, None, "mode 'draft' needs an assistant (draft) model"),
        (
            {"model": "tiny", "chunk_size": 0},
            "chunk_size",
            "chunk_size: Input should be greater than or equal to 1",
        ),
        (
            {"model": "tiny", "top_p": 0, "seed": -1},
            "top_p",
            "top_p: Input should be greater than 0; seed: Input should be greater than or equal to 0",
        ),
        (
            {"model": "tiny", "mode": "none", "assistant": "tiny-plain"},
            None,
            "mode 'none' takes no assistant model",
        ),
    ],
)
def test_invalid_options_are_422(client: TestClient, params: dict, field: str | None, message: str) -> None:
    response = client.post("/v1/jobs", params=params, files={"file": ("p.jsonl", jsonl(PROMPTS))})
    assert response.status_code == 422
    assert response.json() == {
        "error": {
            "code": "invalid_options",
            "message": f"invalid job options: {message}",
            "details": [{"line": None, "field": field, "message": message}],
        }
    }


def test_a_model_path_is_refused(client: TestClient, api_settings: Settings) -> None:
    """The API names models from the allow-list only: an arbitrary path never reaches a worker."""
    path = api_settings.model_entry("tiny").target
    response = client.post("/v1/jobs", params={"model": path}, files={"file": ("p.jsonl", jsonl(PROMPTS))})
    assert response.status_code == 422
    assert response.json()["error"]["details"][0]["field"] == "model"


def test_unknown_query_parameters_are_refused(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs", params={"model": "tiny", "max_new_token": 3}, files={"file": ("p.jsonl", jsonl(PROMPTS))}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["details"][0]["field"] == "max_new_token"


def test_the_query_parameters_are_the_job_options(client: TestClient) -> None:
    """One declaration (genjob.options.JobOptions): every option is a parameter, with its range."""
    operation = client.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]
    parameters = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert set(parameters) == set(JobOptions.model_fields)
    assert parameters["model"]["required"] is True
    assert parameters["draft_tokens"]["schema"]["maximum"] == 64


def test_an_assistant_from_the_allow_list(client: TestClient, api_settings: Settings) -> None:
    job = submit(client, model="tiny-plain", assistant="tiny")
    assert (job["mode"], job["model"], job["assistant"]) == ("auto", "tiny-plain", "tiny")


def test_list_newest_first_paginated_and_filtered(client: TestClient) -> None:
    ids = [submit(client, name=f"job{i}")["id"] for i in range(3)]
    assert client.post(f"/v1/jobs/{ids[1]}/cancel").status_code == 200

    page = client.get("/v1/jobs", params={"limit": 2}).json()
    assert [job["id"] for job in page["data"]] == [ids[2], ids[1]]
    assert (page["limit"], page["offset"], page["next_offset"]) == (2, 0, 2)
    rest = client.get("/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert rest["data"][0]["id"] == ids[0]

    cancelled = client.get("/v1/jobs", params={"status": "cancelled", "limit": 200}).json()
    assert ids[1] in [job["id"] for job in cancelled["data"]]
    assert {job["status"] for job in cancelled["data"]} == {"cancelled"}
    assert client.get("/v1/jobs", params={"status": "nope"}).status_code == 422


def test_get_a_job_with_its_counts_and_stats(client: TestClient, api_settings: Settings) -> None:
    job_id = submit(client, schedule="constant", draft_tokens=3)["id"]  # drafts every round: stats to check
    run_pending_here(api_settings, job_id)
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["total"], job["done"], job["failed"]) == ("completed", 3, 3, 0)
    stats = job["stats"]
    assert stats["new_tokens"] == 5 + 3 + 5
    assert stats["new_tokens"] == stats["target_rounds"] + stats["draft_accepted"]
    assert stats["draft_proposed"] > 0
    assert stats["acceptance_rate"] == pytest.approx(stats["draft_accepted"] / stats["draft_proposed"])
    tried = stats["draft_accepted"] + stats["draft_rejections"]
    assert stats["alpha"] == pytest.approx(stats["draft_accepted"] / tried)
    assert set(stats["gamma_hist"]) == {"3"}  # constant γ; probe rounds are not in the histogram
    assert client.get(f"/v1/jobs/{job_id[:8]}").json()["id"] == job_id  # a unique prefix will do


def test_unknown_and_malformed_job_ids(client: TestClient) -> None:
    missing = client.get("/v1/jobs/0123456789ab")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "not_found", "message": "no job '0123456789ab'", "details": []}
    }
    for unknown in ("not-an-id", "x" * 300, "%20"):
        assert client.get(f"/v1/jobs/{unknown}").status_code == 404
        assert client.get(f"/v1/jobs/{unknown}/results").status_code == 404
    assert client.get("/v1/nowhere").json()["error"]["code"] == "not_found"


def test_results_stream_in_input_order(client: TestClient, api_settings: Settings) -> None:
    job_id = submit(client)["id"]
    run_pending_here(api_settings, job_id)
    with client.stream("GET", f"/v1/jobs/{job_id}/results") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/jsonl")
        records = [json.loads(line) for line in response.iter_lines() if line]
    assert [(r["id"], r["index"], r["line"], r["status"], r["new_tokens"]) for r in records] == [
        ("first", 0, 1, "done", 5),
        (None, 1, 2, "done", 3),
        ("third", 2, 3, "done", 5),
    ]
    rows = list(csv.DictReader(io.StringIO(client.get(f"/v1/jobs/{job_id}/results?format=csv").text)))
    assert [row["id"] for row in rows] == ["first", "", "third"]
    assert [row["output"] for row in rows] == [r["output"] for r in records]


def test_results_as_openai_batch_output(client: TestClient, api_settings: Settings) -> None:
    job_id = submit(client)["id"]
    run_pending_here(api_settings, job_id)
    lines = client.get(f"/v1/jobs/{job_id}/results", params={"format": "openai"}).text.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["custom_id"] for r in records] == ["first", None, "third"]
    body = records[0]["response"]["body"]
    assert records[0]["error"] is None and records[0]["response"]["status_code"] == 200
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] in ("length", "stop")


def test_cancel_then_cancel_again(client: TestClient, api_settings: Settings) -> None:
    job_id = submit(client)["id"]
    response = client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    again = client.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "job_ended",
        "message": f"job {job_id} already ended (cancelled)",
        "details": [],
    }
    with session_scope(api_settings.database_url) as session:
        statuses = set(session.scalars(select(Item.status).where(Item.job_id == job_id)))
    assert statuses == {"cancelled"}
    records = client.get(f"/v1/jobs/{job_id}/results?format=openai").text.splitlines()
    assert json.loads(records[0])["error"]["code"] == "item_cancelled"


def test_requeue_pushes_the_pending_chunks_again(client: TestClient, queue_name: str) -> None:
    job_id = submit(client)["id"]
    response = client.post(f"/v1/jobs/{job_id}/requeue")
    assert response.status_code == 200
    assert response.json()["chunks"] == 0  # its submit queued everything: nothing is missing
    assert queue_depths(REDIS_URL, [queue_name])[queue_name] == 2
    response = client.post(f"/v1/jobs/{job_id}/requeue?all=true")
    assert response.status_code == 200
    assert response.json()["chunks"] == 2
    assert queue_depths(REDIS_URL, [queue_name])[queue_name] == 4


def test_other_methods_answer_in_the_error_shape(client: TestClient) -> None:
    response = client.delete("/v1/jobs")
    assert response.status_code == 405
    assert response.json() == {
        "error": {"code": "method_not_allowed", "message": "Method Not Allowed", "details": []}
    }


def test_embedded_mode_runs_the_job_after_answering(
    tmp_path, model_list: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'g.db'}", models=model_list)
    with TestClient(create_app(settings), client=("127.0.0.1", 1)) as local:
        response = local.post(
            "/v1/jobs",
            params={"model": "tiny", "max_new_tokens": 3},
            files={"file": ("p.jsonl", jsonl(PROMPTS))},
        )
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "queued"
        job = local.get(f"/v1/jobs/{response.json()['id']}").json()  # the background task has run
    assert (job["status"], job["done"]) == ("completed", 3)


def test_results_filtered_as_parquet_and_csv_safe(client: TestClient, api_settings: Settings) -> None:
    import io

    import pyarrow.parquet as pq

    body = jsonl([{"prompt": "a", "id": "=1+1"}, {"prompt": "b", "id": "two"}])
    job_id = client.post(
        "/v1/jobs",
        params={"model": "tiny", "max_new_tokens": 3},
        content=body,
        headers={"Content-Type": "application/jsonl"},
    ).json()["id"]
    run_pending_here(api_settings, job_id)
    parquet = client.get(f"/v1/jobs/{job_id}/results", params={"format": "parquet"})
    assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
    rows = pq.read_table(io.BytesIO(parquet.content)).to_pylist()
    assert [(r["id"], r["status"], r["mode"]) for r in rows] == [
        ("=1+1", "done", "auto"),
        ("two", "done", "auto"),
    ]
    assert client.get(f"/v1/jobs/{job_id}/results", params={"status": "failed"}).text == ""
    safe = client.get(f"/v1/jobs/{job_id}/results", params={"format": "csv", "csv_safe": True}).text
    assert safe.splitlines()[1].startswith("'=1+1,0,1,done,")
