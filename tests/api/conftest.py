"""The API app on real Postgres and Redis: settings with an API key and a model allow-list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from genjob.api.app import create_app
from genjob.settings import Settings
from tests.support.api import API_KEY, AUTH
from tests.support.databases import REDIS_URL
from tests.support.models import with_chat_template


@pytest.fixture(scope="session")
def chat_target(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with a chat template on its tokenizer."""
    return with_chat_template(tiny_pair[0], tmp_path_factory.mktemp("chat") / "target")


@pytest.fixture
def model_list(tiny_pair: tuple[Path, Path], chat_target: Path) -> dict[str, dict[str, str]]:
    target, draft = tiny_pair
    return {
        "tiny": {"target": str(target), "draft": str(draft)},
        "tiny-chat": {"target": str(chat_target), "draft": str(draft)},
        "tiny-plain": {"target": str(target)},
    }


@pytest.fixture
def api_settings(pg_url: str, queue_name: str, model_list: dict) -> Settings:
    return Settings(
        database_url=pg_url,
        broker_url=REDIS_URL,
        queue=queue_name,
        api_keys=(API_KEY,),
        models=model_list,
        chunk_size=2,
        max_upload_bytes=64 << 10,
    )


@pytest.fixture
def client(api_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(api_settings), headers=AUTH) as client:
        yield client
