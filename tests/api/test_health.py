"""GET /healthz reports the database (migrated to head) and the broker, 503 when one is down."""

from __future__ import annotations

from fastapi.testclient import TestClient

from genjob.api.app import create_app
from genjob.settings import Settings


def test_healthy(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_broker_down_is_503(api_settings: Settings) -> None:
    settings = api_settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    response = TestClient(create_app(settings)).get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"]) == ("unavailable", "ok")
    assert body["broker"].startswith("unreachable (")


def test_database_down_is_503(api_settings: Settings) -> None:
    settings = api_settings.model_copy(update={"database_url": "postgresql+psycopg://postgres@127.0.0.1:1/x"})
    response = TestClient(create_app(settings)).get("/healthz")
    assert response.status_code == 503
    assert response.json()["database"] == "unreachable (OperationalError)"


def test_embedded_mode_has_no_broker(tmp_path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'g.db'}")
    with TestClient(create_app(settings), client=("127.0.0.1", 1)) as client:  # lifespan migrates SQLite
        assert client.get("/healthz").json() == {"status": "ok", "database": "ok", "broker": "embedded"}
