"""Requests at the edges: a compressed body is refused naming its encoding, a huge id is echoed cut
short, a client that hangs up mid-body is one line at INFO (no traceback at ERROR)."""

from __future__ import annotations

import asyncio
import gzip
import logging

import pytest
from fastapi.testclient import TestClient
from starlette.requests import ClientDisconnect

from genjob.api import errors
from tests.support.api import jsonl

LINES = jsonl([{"prompt": "def foo(x):"}])


def test_a_gzipped_body_is_415_naming_the_encoding(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny"},
        content=gzip.compress(LINES),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/x-ndjson"},
    )
    assert response.status_code == 415
    assert response.json()["error"] == {
        "code": "unsupported_media_type",
        "message": "Content-Encoding 'gzip' is not accepted: send the body uncompressed",
        "details": [],
    }


def test_a_huge_id_is_echoed_cut_short(client: TestClient) -> None:
    response = client.get(f"/v1/jobs/{'a' * 60_000}")
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert message == f"no job {'a' * 64!r}… (59936 more characters)"


def test_a_client_hanging_up_is_logged_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    class Request:
        method, url = "POST", type("Url", (), {"path": "/v1/jobs"})()

    with caplog.at_level(logging.INFO, logger=errors.log.name):
        response = asyncio.run(errors._client_gone(Request(), ClientDisconnect()))  # type: ignore[arg-type]
    assert response.status_code == 400
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "client hung up during POST /v1/jobs")
    ]
