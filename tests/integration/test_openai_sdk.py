"""The official openai package drives genjob's Files and Batches APIs unchanged: a live `genjob api`
(Granian) and a real Celery worker (scripted models) on real Postgres and Redis.

Upload → create → poll → download the output and error files → parse them as the SDK's types; list
with pagination; cancel mid-run ends `cancelled` with partial output; a bad line ends `failed` with
`errors` naming it; a create whose answer is lost is retried by the SDK and makes one batch; another
key gets 404 for the batch, its files, its job and its results.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types import Batch, Completion
from sqlalchemy import select

from genjob.db import session_scope
from genjob.tables import Batch as BatchRow
from genjob.tables import Item
from tests.support.processes import (
    FAST_RECOVERY,
    GENJOB,
    ServiceProcess,
    free_port,
    service_env,
    wait_until_serving,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

KEY, OTHER_KEY = "sdk-key-0123456789", "sdk-other-0123456789"
MODELS = json.dumps({"scripted": {"target": "scripted"}})  # a hub id: the scripted worker's stand-in
ENDED = {"completed", "failed", "expired", "cancelled"}


def request_lines(prompts: list[str], **body) -> bytes:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "scripted", "prompt": prompt, **body},
        }
        for i, prompt in enumerate(prompts)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


@pytest.fixture
def service(
    request: pytest.FixtureRequest, pg_url: str, queue_name: str, tmp_path: Path, start_worker
) -> Iterator[str]:
    """A live API and one scripted worker (4 items a chunk, or the test's ``worker_settings`` mark);
    yields the API's base URL."""
    mark = request.node.get_closest_marker("worker_settings")
    port = free_port()
    env = service_env(
        pg_url,
        queue_name,
        **{**FAST_RECOVERY, "chunk_size": "4", **(mark.kwargs if mark else {})},
        api_keys=f"{KEY},{OTHER_KEY}",
        models=MODELS,
    )
    start_worker(f"{queue_name}-a", env)
    with ServiceProcess([GENJOB, "api", "--port", str(port)], env, tmp_path / "api.log"):
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base)
        yield base


def client(base: str, key: str = KEY, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, **options)


def wait_for_batch(sdk: openai.OpenAI, batch_id: str, statuses=ENDED, timeout: float = 90) -> Batch:
    return wait_for(
        lambda: (batch := sdk.batches.retrieve(batch_id)).status in statuses and batch,
        timeout=timeout,
        what=f"batch {batch_id} to reach {statuses}",
        every=0.2,
    )


def test_upload_create_poll_download_and_parse(service: str, pg_url: str) -> None:
    sdk = client(service)
    prompts = ["def f(x):", "import os", "poison", "class A:", "x = 1"]
    settings = {
        "temperature": 0,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n\n"],
        "n": 1,
        "stream": False,
        "user": "u",
    }
    uploaded = sdk.files.create(file=("requests.jsonl", request_lines(prompts, **settings)), purpose="batch")
    assert (uploaded.purpose, uploaded.status, uploaded.filename) == ("batch", "processed", "requests.jsonl")
    assert sdk.files.retrieve(uploaded.id).bytes == uploaded.bytes

    batch = sdk.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/completions",
        completion_window="24h",
        metadata={"team": "search"},
    )
    assert batch.status == "in_progress"
    assert (batch.endpoint, batch.metadata, batch.model) == (
        "/v1/completions",
        {"team": "search"},
        "scripted",
    )
    assert batch.expires_at == batch.created_at + 24 * 3600

    ended = wait_for_batch(sdk, batch.id)
    assert ended.status == "completed"
    assert ended.request_counts is not None
    assert (ended.request_counts.total, ended.request_counts.completed, ended.request_counts.failed) == (
        5,
        4,
        1,
    )
    assert ended.completed_at is not None and ended.output_file_id and ended.error_file_id
    assert ended.usage is not None and ended.usage.output_tokens == 4

    output = [json.loads(line) for line in sdk.files.content(ended.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == ["r0", "r1", "r3", "r4"]
    for line in output:
        body = Completion.model_validate(line["response"]["body"])
        assert body.choices[0].text.startswith("echo: ")
        assert body.usage is not None and body.usage.completion_tokens_details is not None
        assert body.usage.completion_tokens_details.accepted_prediction_tokens == 0
        assert line["response"]["body"]["genjob"]["mode"] == "auto"
    errors = [json.loads(line) for line in sdk.files.content(ended.error_file_id).text.splitlines()]
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [("r2", "item_failed")]
    assert {f.purpose for f in sdk.files.list() if f.id in (ended.output_file_id, ended.error_file_id)} == {
        "batch_output"
    }
    with session_scope(pg_url) as session:  # the lines' own settings reached the items the worker reads
        items = session.scalars(
            select(Item).where(Item.job_id == ended.model_extra["genjob"]["job_id"])
        ).all()
        assert {(i.temperature, i.top_p, i.seed, tuple(i.stop or ())) for i in items} == {
            (0.0, 0.9, 3, ("\n\n",))
        }

    other = client(service, OTHER_KEY)
    job_id = ended.model_extra["genjob"]["job_id"]
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.files.retrieve(uploaded.id),
        lambda: other.files.content(ended.output_file_id),
        lambda: other.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/results"):
        assert httpx.get(service + path, headers={"Authorization": f"Bearer {OTHER_KEY}"}).status_code == 404
        assert httpx.get(service + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert sdk.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(uploaded.id)


def test_list_with_pagination(service: str) -> None:
    sdk = client(service, OTHER_KEY)
    file = sdk.files.create(file=("p.jsonl", request_lines(["a b"])), purpose="batch")
    made = [
        sdk.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h").id
        for _ in range(3)
    ]
    page = sdk.batches.list(limit=2)
    assert [b.id for b in page.data] == made[::-1][:2]
    assert page.has_more
    assert [b.id for b in sdk.batches.list(limit=2)] == made[::-1]  # auto-paging walks every page
    assert [b.id for b in sdk.batches.list(limit=2, after=made[1]).data] == [made[0]]


def test_cancel_mid_run_keeps_the_finished_part(service: str) -> None:
    sdk = client(service)
    file = sdk.files.create(file=("slow.jsonl", request_lines(["sleep=0.3"] * 20)), purpose="batch")
    batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h")
    wait_for(
        lambda: sdk.batches.retrieve(batch.id).request_counts.completed >= 2,  # type: ignore[union-attr]
        timeout=60,
        what="two requests done",
    )
    assert sdk.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    ended = wait_for_batch(sdk, batch.id, {"cancelled"})
    assert ended.cancelled_at is not None and ended.request_counts is not None
    done = ended.request_counts.completed
    assert 2 <= done < 20
    output = sdk.files.content(ended.output_file_id).text.splitlines()
    assert len(output) == done
    errors = [json.loads(line) for line in sdk.files.content(ended.error_file_id).text.splitlines()]
    assert len(errors) == 20 - done
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}


@pytest.mark.worker_settings(chunk_size="24", batch_size="24")
def test_cancel_stops_the_rows_in_flight(service: str, pg_url: str) -> None:
    """24 requests decoded as one batch of 24 rows (each in flight for ~60 steps): a cancel drops the
    rows at the engine's next check instead of letting the whole batch run to its end."""
    sdk = client(service)
    file = sdk.files.create(
        file=("wide.jsonl", request_lines(["rounds=60 sleep=0.005"] * 24)), purpose="batch"
    )
    batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h")
    job_id = batch.model_extra["genjob"]["job_id"]

    def running() -> int:
        with session_scope(pg_url) as session:
            return len(
                session.scalars(select(Item.id).where(Item.job_id == job_id, Item.status == "running")).all()
            )

    wait_for(lambda: running() == 24, timeout=60, what="all 24 rows in flight")
    assert sdk.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    ended = wait_for_batch(sdk, batch.id, {"cancelled"})
    assert ended.request_counts is not None and ended.request_counts.completed < 24
    errors = [json.loads(line) for line in sdk.files.content(ended.error_file_id).text.splitlines()]
    assert len(errors) == 24 - ended.request_counts.completed
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    with session_scope(pg_url) as session:
        statuses = session.scalars(select(Item.status).where(Item.job_id == job_id)).all()
    assert "running" not in statuses and statuses.count("cancelled") == len(errors)


def test_a_bad_line_fails_the_batch_naming_the_line(service: str) -> None:
    sdk = client(service)
    lines = request_lines(["fine"]) + b'{"custom_id": "r1", "body": {"model": "scripted"}}\n'
    lines += request_lines(["other model"]).replace(b'"scripted"', b'"gpt-4o"')
    file = sdk.files.create(file=("bad.jsonl", lines), purpose="batch")
    batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data is not None
    assert [(e.line, e.param) for e in batch.errors.data] == [(2, "body"), (3, "body.model")]
    assert "gpt-4o" in (batch.errors.data[1].message or "")
    assert sdk.batches.retrieve(batch.id).status == "failed"
    assert batch.output_file_id is None and batch.model_extra["genjob"]["job_id"] is None

    unknown = sdk.files.create(
        file=("m.jsonl", request_lines(["x"]).replace(b"scripted", b"nope")), purpose="batch"
    )
    failed = sdk.batches.create(input_file_id=unknown.id, endpoint="/v1/completions", completion_window="24h")
    assert failed.status == "failed" and failed.errors is not None and failed.errors.data is not None
    assert (failed.errors.data[0].code, failed.errors.data[0].line) == ("model_not_found", 1)


class DropFirstBatchAnswer:
    """A TCP proxy in front of the API that forwards everything, except that it swallows the answer to
    the first ``POST /v1/batches`` and closes that connection: the request was served, its answer lost."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        swallow = threading.Event()

        def answers() -> None:
            while data := upstream.recv(65536):
                if swallow.is_set():  # shutdown, not just close: the other thread blocks in recv
                    self.dropped.set()
                    for end in (conn, upstream):
                        end.shutdown(socket.SHUT_RDWR)
                        end.close()
                    return
                conn.sendall(data)
            conn.close()

        threading.Thread(target=answers, daemon=True).start()
        try:
            while data := conn.recv(65536):
                if data.startswith(b"POST /v1/batches ") and not self.dropped.is_set():
                    swallow.set()
                upstream.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_sdk_retries_of_a_create_make_one_batch(service: str, pg_url: str) -> None:
    proxy = DropFirstBatchAnswer(int(service.rsplit(":", 1)[1]))
    try:
        sdk = client(f"http://127.0.0.1:{proxy.port}", max_retries=2, timeout=30)
        file = sdk.files.create(file=("p.jsonl", request_lines(["once"])), purpose="batch")
        batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/completions", completion_window="24h")
        assert proxy.dropped.is_set()  # the first answer was lost, and the SDK tried again
    finally:
        proxy.close()
    with session_scope(pg_url) as session:
        made = session.scalars(select(BatchRow.id).where(BatchRow.input_file_id == file.id)).all()
    assert made == [batch.id]

    direct = client(service, max_retries=0)
    keyed = [
        direct.batches.create(
            input_file_id=file.id,
            endpoint="/v1/completions",
            completion_window="24h",
            extra_headers={"Idempotency-Key": "nightly-7"},
        ).id
        for _ in range(2)
    ]
    assert keyed[0] == keyed[1] != batch.id
    with pytest.raises(openai.ConflictError):
        direct.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_headers={"Idempotency-Key": "nightly-7"},
        )
