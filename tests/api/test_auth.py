"""API keys: refused without one or with a wrong one; local-only mode serves loopback clients only."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from genjob.api.app import UnsafeBind, check_bind, create_app
from genjob.settings import Settings
from tests.support.api import API_KEY, jsonl


@pytest.fixture
def anonymous(api_settings: Settings) -> TestClient:
    return TestClient(create_app(api_settings))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/0123456789ab"),
        ("POST", "/v1/jobs"),
        ("POST", "/v1/jobs/ab/cancel"),
    ],
)
def test_no_key_is_401(anonymous: TestClient, method: str, path: str) -> None:
    response = anonymous.request(method, path, params={"model": "tiny"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json() == {
        "error": {
            "code": "unauthorized",
            "message": "missing API key: send Authorization: Bearer <key>",
            "details": [],
        }
    }


def test_wrong_key_is_401_and_nothing_is_read(anonymous: TestClient) -> None:
    response = anonymous.post(
        "/v1/jobs",
        params={"model": "tiny"},
        files={"file": ("p.jsonl", jsonl([{"prompt": "x"}]))},
        headers={"Authorization": f"Bearer {API_KEY}x"},
    )
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "invalid API key"
    basic = anonymous.get("/v1/jobs", headers={"Authorization": f"Basic {API_KEY}"})
    assert basic.status_code == 401


def test_the_right_key_passes(anonymous: TestClient) -> None:
    assert anonymous.get("/v1/jobs", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200


def test_health_needs_no_key(anonymous: TestClient) -> None:
    assert anonymous.get("/healthz").status_code == 200


def test_local_only_mode_serves_loopback_clients_only(pg_url: str) -> None:
    settings = Settings(database_url=pg_url)
    assert settings.local_only
    local = TestClient(create_app(settings), client=("127.0.0.1", 50000))
    assert local.get("/v1/jobs").status_code == 200
    remote = TestClient(create_app(settings), client=("10.1.2.3", 50000))
    response = remote.get("/v1/jobs")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_local_only_mode_refuses_to_bind_beyond_loopback(api_settings: Settings) -> None:
    keyless = Settings(database_url=api_settings.database_url)
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(keyless, host)
    with pytest.raises(UnsafeBind, match=r"refusing to listen on 0\.0\.0\.0 without API keys"):
        check_bind(keyless, "0.0.0.0")
    check_bind(api_settings, "0.0.0.0")  # with keys, anywhere
