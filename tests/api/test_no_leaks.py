"""The API's errors name no broker, host or port, and hold no password: a broker and a database URL
carrying one (``tests.support.leaks``), the broker not answering; the server's log names it masked."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from genjob.api.app import create_app
from genjob.settings import Settings
from tests.support.api import AUTH, jsonl
from tests.support.leaks import assert_no_secret, dead_broker_url, planted_database_url


def test_the_api_names_no_broker_and_logs_it_masked(
    pg_url: str, queue_name: str, api_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    broker = dead_broker_url()
    port = broker.rsplit(":", 1)[1].split("/")[0]
    values = {name: getattr(api_settings, name) for name in Settings.model_fields}
    settings = Settings(**{**values, "broker_url": broker, "database_url": planted_database_url(pg_url)})
    with TestClient(create_app(settings), headers=AUTH) as client:
        created = client.post(
            "/v1/jobs", params={"model": "tiny"}, files={"file": ("p.jsonl", jsonl([{"prompt": "a"}]))}
        )
        assert created.status_code == 503
        error = created.json()["error"]
        assert error["code"] == "broker_unavailable"
        assert error["message"].startswith("the broker is unavailable: job ")
        job_id = error["message"].split()[5]
        requeued = client.post(f"/v1/jobs/{job_id}/requeue")
        assert requeued.status_code == 503
        health = client.get("/healthz")
        assert health.status_code == 503
        for response in (created, requeued, health):
            assert_no_secret(response.text)
            assert "redis" not in response.text and port not in response.text  # no host, no port
    assert_no_secret(caplog.text)
    assert f"redis://genjob:***@127.0.0.1:{port}/0" in caplog.text  # the operator's log names it
