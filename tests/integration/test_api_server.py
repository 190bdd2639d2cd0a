"""`genjob api` as a real server (Granian): local-only mode said loudly, health, a streamed 413, a job."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.support.processes import GENJOB, ServiceProcess, free_port, service_env, wait_until_serving

pytestmark = pytest.mark.integration


def test_local_only_server(
    pg_url: str, queue_name: str, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, draft = tiny_pair
    port = free_port()
    models = json.dumps({"tiny": {"target": str(target), "draft": str(draft)}})
    env = service_env(pg_url, queue_name, models=models, max_upload_bytes="4096")
    log = tmp_path / "api.log"
    base = f"http://127.0.0.1:{port}"
    with ServiceProcess([GENJOB, "api", "--port", str(port)], env, log):
        health = wait_until_serving(base)
        assert health.json() == {"status": "ok", "database": "ok", "broker": "ok"}
        assert "LOCAL-ONLY MODE" in log.read_text()

        def chunks():  # chunked transfer, no Content-Length: cut off while streaming
            for _ in range(100):
                yield b'{"prompt": "' + b"x" * 100 + b'"}\n'

        too_big = httpx.post(
            f"{base}/v1/jobs",
            params={"model": "tiny"},
            content=chunks(),
            headers={"Content-Type": "application/jsonl"},
        )
        assert too_big.status_code == 413
        assert too_big.json()["error"]["code"] == "payload_too_large"

        created = httpx.post(
            f"{base}/v1/jobs",
            params={"model": "tiny", "max_new_tokens": 4},
            files={"file": ("p.jsonl", b'{"prompt": "def f():", "id": "a"}\n')},
        )
        assert created.status_code == 201, created.text
        job = httpx.get(f"{base}/v1/jobs/{created.json()['id']}").json()
        assert (job["status"], job["total"], job["model"]) == ("queued", 1, "tiny")
    warning = "no API keys configured (GENJOB_API_KEYS): LOCAL-ONLY MODE, no authentication"
    assert warning in log.read_text()
