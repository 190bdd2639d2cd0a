"""Settings from the environment: API keys, the model allow-list; still one hashable object; and the
database URL as the CLI's reading commands take it without pydantic, equal to Settings' own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from genjob.cli import context
from genjob.settings import EMBEDDED_DATABASE_URL, Settings, get_settings
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


def test_the_cli_reads_the_database_url_as_settings_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``genjob status`` reads GENJOB_DATABASE_URL without pydantic: the same URL in every case."""
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.lower().startswith("genjob_")]:
        monkeypatch.delenv(name)
    assert context.EMBEDDED_DATABASE_URL == EMBEDDED_DATABASE_URL

    def both() -> tuple[str, str]:
        get_settings.cache_clear()  # a .env file is read through get_settings()
        return context.database_url(), Settings().database_url

    try:
        assert both() == (EMBEDDED_DATABASE_URL,) * 2
        monkeypatch.setenv("genjob_database_url", "sqlite:///lower.db")  # any case, as pydantic-settings
        assert both() == ("sqlite:///lower.db",) * 2
        monkeypatch.delenv("genjob_database_url")
        (tmp_path / ".env").write_text("GENJOB_DATABASE_URL='sqlite:///dotenv.db'  # a comment\n")
        assert both() == ("sqlite:///dotenv.db",) * 2
        monkeypatch.setenv("GENJOB_DATABASE_URL", "sqlite:///env.db")  # the environment before .env
        assert both() == ("sqlite:///env.db",) * 2
        (tmp_path / ".env").unlink()
        monkeypatch.setenv("GENJOB_CHUNK_SIZE", "lots")  # another setting: checked, as by Settings
        get_settings.cache_clear()
        with pytest.raises(ValidationError, match="chunk_size"):
            context.database_url()
    finally:
        get_settings.cache_clear()
