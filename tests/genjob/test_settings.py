"""Settings from the environment: API keys, the model allow-list; still one hashable object."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from genjob.settings import Settings
from genjob.worker.celery_app import create_app


def test_api_keys_comma_separated_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_API_KEYS", " k1, k2 ,")
    assert [key.get_secret_value() for key in Settings().api_keys] == ["k1", "k2"]
    monkeypatch.setenv("GENJOB_API_KEYS", '["a,b"]')
    assert [key.get_secret_value() for key in Settings().api_keys] == ["a,b"]
    assert "k1" not in repr(Settings(api_keys=("k1",)))
    monkeypatch.setenv("GENJOB_API_KEYS", "")
    assert Settings().local_only


def test_models_from_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_MODELS", json.dumps({"demo": {"target": "/t", "draft": "/d"}, "x": "/x"}))
    settings = Settings()
    assert [(m.name, m.target, m.draft) for m in settings.models] == [("demo", "/t", "/d"), ("x", "/x", None)]
    assert settings.model_entry("x").target == "/x"
    assert settings.model_entry("nope") is None
    monkeypatch.setenv("GENJOB_MODELS", json.dumps({"demo": {"target": "/t", "trust_remote_code": True}}))
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Settings()


def test_settings_stay_hashable_for_the_cached_celery_app() -> None:
    settings = Settings(api_keys=("k",), models={"demo": "/t"})
    assert hash(settings) == hash(Settings(api_keys=("k",), models={"demo": "/t"}))
    assert create_app(settings) is create_app(settings)
