"""The API and the CLI make the same job: same validation code, same rows, for both line formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select

from genjob.api.deps import owner_of_key
from genjob.cli import main
from genjob.db import session_scope
from genjob.settings import Settings, get_settings
from genjob.tables import Item, Job
from tests.support.api import API_KEY, jsonl, run_pending_here
from tests.support.databases import REDIS_URL

GENJOB_LINES = [
    {"prompt": "def foo(x):", "id": "a"},
    {"prompt": "import os", "max_new_tokens": 3},
    {"prompt": "class A:", "id": "c"},
]
OPENAI_CHAT_LINES = [
    {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "def foo(x):"},
            ],
            "max_tokens": 4,
        },
    },
    {
        "custom_id": "r2",
        "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "import"}]}]},
    },
]
NOT_COMPARED = {"id", "job_id", "created_at", "queue_progress_at"}  # timestamps


def rows(url: str, job_id: str) -> tuple[dict, list[dict]]:
    def columns(obj) -> dict:
        return {
            a.key: getattr(obj, a.key) for a in inspect(obj).mapper.column_attrs if a.key not in NOT_COMPARED
        }

    with session_scope(url) as session:
        job = session.get(Job, job_id)
        items = session.scalars(select(Item).where(Item.job_id == job_id).order_by(Item.seq)).all()
        return columns(job), [columns(item) for item in items]


@pytest.fixture
def cli_env(api_settings: Settings, model_list: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_DATABASE_URL", api_settings.database_url)
    monkeypatch.setenv("GENJOB_BROKER_URL", REDIS_URL)
    monkeypatch.setenv("GENJOB_QUEUE", api_settings.queue)
    monkeypatch.setenv("GENJOB_CHUNK_SIZE", str(api_settings.chunk_size))
    monkeypatch.setenv("GENJOB_MODELS", json.dumps(model_list))
    get_settings.cache_clear()


@pytest.mark.parametrize(
    ("records", "model", "input_format"),
    [(GENJOB_LINES, "tiny", "genjob"), (OPENAI_CHAT_LINES, "tiny-chat", "openai")],
    ids=["genjob-lines", "openai-chat-lines"],
)
def test_api_and_cli_jobs_are_indistinguishable(
    client: TestClient, api_settings: Settings, cli_env: None, tmp_path: Path, records, model, input_format
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(jsonl(records))
    options = {"model": model, "input_format": input_format, "max_new_tokens": 5, "seed": 7, "name": "same"}
    response = client.post("/v1/jobs", params=options, files={"file": ("p.jsonl", path.read_bytes())})
    assert response.status_code == 201, response.text
    argv = ["submit", str(path), "-m", model, "--input-format", input_format, "--max-new-tokens", "5"]
    result = CliRunner().invoke(main, [*argv, "--seed", "7", "--name", "same"])
    assert result.exit_code == 0, result.output
    api_job, api_items = rows(api_settings.database_url, response.json()["id"])
    cli_job, cli_items = rows(api_settings.database_url, result.output.strip())
    assert (api_job.pop("owner"), cli_job.pop("owner")) == (owner_of_key(API_KEY), "local")
    assert api_job == cli_job
    assert api_items == cli_items
    assert len(api_items) == len(records)


def test_chat_messages_are_rendered_with_the_chat_template(
    client: TestClient, api_settings: Settings
) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny-chat", "input_format": "openai"},
        files={"file": ("chat.jsonl", jsonl(OPENAI_CHAT_LINES))},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["spec"]["endpoint"] == "/v1/chat/completions"
    _, items = rows(api_settings.database_url, job["id"])
    assert [(i["custom_id"], i["max_new_tokens"]) for i in items] == [("r1", 4), ("r2", None)]
    assert items[0]["prompt"] == "<|system|>\nBe brief.\n<|user|>\ndef foo(x):\n<|assistant|>\n"
    assert items[1]["prompt"] == "<|user|>\nimport\n<|assistant|>\n"

    run_pending_here(api_settings, job["id"])
    lines = client.get(f"/v1/jobs/{job['id']}/results", params={"format": "openai"}).text.splitlines()
    first = json.loads(lines[0])
    assert first["custom_id"] == "r1" and first["error"] is None
    body = first["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 4
    plain = [json.loads(line) for line in client.get(f"/v1/jobs/{job['id']}/results").text.splitlines()]
    assert body["choices"][0]["message"]["content"] == plain[0]["output"]


def test_messages_without_a_chat_template_are_422(client: TestClient, api_settings: Settings) -> None:
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny", "input_format": "openai"},
        files={"file": ("chat.jsonl", jsonl(OPENAI_CHAT_LINES))},
    )
    assert response.status_code == 422
    message = "the tokenizer of 'tiny' has no chat template: send 'prompt' lines (/v1/completions) instead"
    assert api_settings.model_entry("tiny").target not in response.text
    assert response.json()["error"]["details"] == [
        {"line": 1, "field": "body.messages", "message": message},
        {"line": 2, "field": "body.messages", "message": message},
    ]


def test_openai_prompt_lines_and_a_mixed_file(client: TestClient) -> None:
    lines = [{"custom_id": "p1", "body": {"prompt": "def f():", "max_tokens": 2}}]
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny", "input_format": "openai"},
        files={"file": ("p.jsonl", jsonl(lines))},
    )
    assert response.status_code == 201, response.text
    assert response.json()["spec"]["endpoint"] == "/v1/completions"

    mixed = [*lines, {"custom_id": "p2", "body": {"messages": [{"role": "user", "content": "hi"}]}}]
    response = client.post(
        "/v1/jobs",
        params={"model": "tiny-chat", "input_format": "openai"},
        files={"file": ("m.jsonl", jsonl(mixed))},
    )
    assert response.status_code == 422
    assert response.json()["error"]["details"] == [
        {
            "line": 2,
            "field": "body.messages",
            "message": "a /v1/chat/completions request in a file of /v1/completions requests (line 1): "
            "a batch uses one endpoint",
        }
    ]
