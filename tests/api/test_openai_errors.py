"""The OpenAI routes answer errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:
the official SDK, driven in-process against the app, finds the field at fault in ``e.param``, OpenAI's
class of error in ``e.type`` and a code in ``e.code``; a bad parameter is 400 as at OpenAI. The native
routes keep genjob's shape."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient

from genjob.api.app import create_app
from genjob.settings import Settings
from tests.support.api import API_KEY, jsonl

LINES = [{"custom_id": "a", "body": {"model": "tiny", "prompt": "def f(x):", "max_tokens": 2}}]


@pytest.fixture
def http(api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings)) as http:
        yield http


def sdk(http: TestClient, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key=key, http_client=http, max_retries=0)


@pytest.fixture
def uploaded(http: TestClient) -> str:
    return sdk(http).files.create(file=("b.jsonl", jsonl(LINES)), purpose="batch").id


def fails(call, kind: type[openai.APIStatusError]) -> openai.APIStatusError:
    with pytest.raises(kind) as caught:
        call()
    return caught.value


def test_bad_parameters_name_their_field(http: TestClient, uploaded: str) -> None:
    client = sdk(http)
    cases = [
        (lambda: client.batches.list(limit=0), "limit", "integer_below_min_value"),
        (lambda: client.batches.list(limit=101), "limit", "integer_above_max_value"),
        (
            lambda: client.batches.create(
                input_file_id=uploaded,
                endpoint="/v1/embeddings",  # type: ignore[arg-type]  # what a user may send
                completion_window="24h",
            ),
            "endpoint",
            "invalid_value",
        ),
        (
            lambda: client.batches.create(
                input_file_id=uploaded,
                endpoint="/v1/completions",
                completion_window="24h",
                extra_body={"prority": "high"},
            ),
            "prority",
            "unknown_parameter",
        ),
        (
            lambda: client.batches.create(
                input_file_id=uploaded,
                endpoint="/v1/completions",
                completion_window="99y",  # type: ignore[arg-type]
            ),
            "completion_window",
            "invalid_value",
        ),
        (
            lambda: client.files.create(file=("b.jsonl", jsonl(LINES)), purpose="assistants"),
            "purpose",
            "invalid_value",
        ),
    ]
    for call, param, code in cases:
        error = fails(call, openai.BadRequestError)
        assert (error.status_code, error.param, error.type, error.code) == (
            400,
            param,
            "invalid_request_error",
            code,
        ), error.body
        assert param in error.message


def test_missing_ids_are_not_found(http: TestClient) -> None:
    client = sdk(http)
    cases = [
        (lambda: client.batches.retrieve("batch_nope"), None),
        (lambda: client.batches.cancel("batch_nope"), None),
        (lambda: client.batches.list(after="batch_nope"), "after"),
        (lambda: client.files.retrieve("file-nope"), None),
        (lambda: client.files.delete("file-nope"), None),
        (lambda: client.files.list(after="file-nope"), "after"),
        (
            lambda: client.batches.create(
                input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h"
            ),
            "input_file_id",
        ),
    ]
    for call, param in cases:
        error = fails(call, openai.NotFoundError)
        assert (error.param, error.type, error.code) == (param, "invalid_request_error", "not_found")


def test_a_wrong_key_is_an_authentication_error(http: TestClient) -> None:
    error = fails(lambda: sdk(http, key="not-a-key").batches.list(), openai.AuthenticationError)
    assert (error.param, error.type, error.code) == (None, "invalid_request_error", "invalid_api_key")


def test_the_body_has_exactly_openais_fields(http: TestClient) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    missing = http.post("/v1/batches", json={"endpoint": "/v1/completions"}, headers=auth)
    assert missing.status_code == 400
    assert missing.json() == {
        "error": {
            "message": "Missing required parameter: 'input_file_id'.",
            "type": "invalid_request_error",
            "param": "input_file_id",
            "code": "missing_required_parameter",
        }
    }
    not_json = http.post(
        "/v1/batches", content=b"{nope", headers={**auth, "Content-Type": "application/json"}
    )
    assert not_json.status_code == 400
    assert not_json.json()["error"]["code"] == "invalid_json"
    wrong_method = http.put("/v1/batches", headers=auth)
    assert wrong_method.status_code == 405
    assert set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}
    native = http.get("/v1/jobs", params={"limit": 0}, headers=auth)
    assert (native.status_code, set(native.json()["error"])) == (422, {"code", "message", "details"})


def test_expiry_parameters_are_refused_alike_in_one_line(http: TestClient, uploaded: str) -> None:
    """Files last until deleted, output files as long as their batch: OpenAI's expiry parameters are
    refused with the same 400 on files and batches, never accepted and ignored."""
    client = sdk(http)
    calls = [
        lambda: client.files.create(
            file=("b.jsonl", jsonl(LINES)),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        ),
        lambda: client.batches.create(
            input_file_id=uploaded,
            endpoint="/v1/completions",
            completion_window="24h",
            extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 3600}},
        ),
    ]
    for call, name in zip(calls, ("expires_after", "output_expires_after"), strict=True):
        error = fails(call, openai.BadRequestError)
        assert (error.status_code, error.param, error.type) == (400, name, "invalid_request_error")
        assert error.message == (
            f"Error code: 400 - {name} is not supported: a file lasts until it is deleted "
            "(DELETE /v1/files/{id}), a batch's output files as long as their batch"
        )
