"""Idempotent submit: one key makes one job (API, CLI, concurrent tries); other content is refused (409);
keys are scoped to their API key."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from genjob.cli import main
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store.idempotency import IdempotencyConflict
from genjob.submit import Submitter, store_job
from genjob.tables import Job
from tests.support.api import jsonl, with_settings
from tests.support.specs import build_job_spec

PROMPTS = [{"prompt": "def f(x):", "id": "a"}, {"prompt": "import os"}]


def job_count(settings: Settings) -> int:
    with session_scope(settings.database_url) as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def post(client: TestClient, key: str, records: list[dict] = PROMPTS, **params):
    return client.post(
        "/v1/jobs",
        params={"model": "tiny", **params},
        files={"file": ("p.jsonl", jsonl(records))},
        headers={"Idempotency-Key": key},
    )


def test_two_submits_with_one_key_make_one_job(client: TestClient, api_settings: Settings) -> None:
    before = job_count(api_settings)
    first, second = post(client, "k-1"), post(client, "k-1")
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.headers["idempotent-replayed"] == "true"
    assert first.json()["id"] == second.json()["id"]
    assert job_count(api_settings) == before + 1

    other = post(client, "k-1", [{"prompt": "something else"}])
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_conflict"
    assert post(client, "k-1", name="renamed").status_code == 409  # options are content too
    assert job_count(api_settings) == before + 1
    assert post(client, "k-2").json()["id"] != first.json()["id"]


def test_keys_belong_to_their_api_key(api_settings: Settings) -> None:
    from genjob.api.app import create_app

    settings = with_settings(api_settings, **{"api_keys": ("key-one-123456", "key-two-123456")})
    app = create_app(settings)
    one = TestClient(app, headers={"Authorization": "Bearer key-one-123456"})
    two = TestClient(app, headers={"Authorization": "Bearer key-two-123456"})
    with one, two:
        assert post(one, "shared").json()["id"] != post(two, "shared").json()["id"]


def test_concurrent_tries_with_one_key_make_one_job(api_settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl([{"prompt": f"p{i}"} for i in range(2000)]))
    spec = build_job_spec(api_settings, allow_paths=True, model="tiny")
    before = job_count(api_settings)

    def submit_once(_: int) -> str:
        return store_job(
            api_settings, path=path, spec=spec, submitter=Submitter(owner="racer"), idempotency_key="race"
        ).job_id

    with ThreadPoolExecutor(4) as pool:
        ids = set(pool.map(submit_once, range(4)))
    assert len(ids) == 1
    assert job_count(api_settings) == before + 1
    with pytest.raises(IdempotencyConflict):
        store_job(
            api_settings,
            path=path,
            spec=spec.model_copy(update={"max_new_tokens": 7}),
            submitter=Submitter(owner="racer"),
            idempotency_key="race",
        )


def test_cli_submit_with_one_key_twice_is_one_job(
    broker_env: Settings, tiny_pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target = str(tiny_pair[0])
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    argv = ["submit", "p.jsonl", "-m", target, "--mode", "none", "--idempotency-key", "nightly-1"]
    before = job_count(broker_env)
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    job_id = first.stdout.strip()
    second = CliRunner().invoke(main, argv)
    assert second.exit_code == 0
    assert second.stdout == f"{job_id}\n"
    assert second.stderr == f"already submitted with this idempotency key: job {job_id}\n"
    assert job_count(broker_env) == before + 1

    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "changed"}) + "\n")
    changed = CliRunner().invoke(main, argv)
    assert changed.exit_code == 1
    assert changed.output == (
        "Error: the idempotency key 'nightly-1' was already used with a different request; "
        "send the same request to get its result, or use a new key\n"
    )
    assert job_count(broker_env) == before + 1
