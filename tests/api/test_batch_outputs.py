"""A batch's output and error files are written once, in input order, streamed for any size; the
batch's status follows its job (finalizing while requests finish, expired, cancelled)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import update

from genjob import batch_files, batches, store
from genjob.api.prompt_tokenizer import PromptTokenizer
from genjob.constants import OpenAIEndpoint
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.tables import Item, Job, Result, utcnow
from tests.support.api import jsonl, with_settings

ITEMS = 2500  # more than the results' read batch (1000): reads and writes interleave on one connection


@pytest.fixture
def big_settings(api_settings: Settings) -> Settings:
    return with_settings(api_settings, max_upload_bytes=8 << 20)


def make_batch(settings: Settings, owner: str = "key-outputs") -> tuple[str, str]:
    lines = [{"custom_id": f"r{i}", "body": {"model": "tiny", "prompt": f"p{i}"}} for i in range(ITEMS)]
    with session_scope(settings.database_url) as session:
        file = file_store.put_file(
            session, owner=owner, purpose="batch", filename="in.jsonl", chunks=[jsonl(lines)]
        )
        file_id = file.id
    request = batches.BatchRequest(input_file_id=file_id, endpoint=OpenAIEndpoint.COMPLETIONS)
    batch_id, reused = batches.create_batch(
        settings,
        owner=owner,
        request=request,
        tokenizer_for=lambda path, name: PromptTokenizer(path, label=name),
    )
    assert not reused
    with session_scope(settings.database_url) as session:
        return batch_id, batches.get_batch(session, batch_id=batch_id, owner=owner).job_id


def finish(settings: Settings, job_id: str, *, done_below: int) -> None:
    """Items with seq < done_below done (with a result), the rest failed; the job completed."""
    with session_scope(settings.database_url) as session:
        items = session.query(Item.id, Item.seq).filter(Item.job_id == job_id).all()
        session.execute(
            Result.__table__.insert(),
            [
                {
                    "job_id": job_id,
                    "item_id": item_id,
                    "output": f"out {seq}",
                    "finish_reason": "length",
                    "mode": "draft",
                    "prompt_tokens": 2,
                    "new_tokens": 3,
                    "target_rounds": 2,
                    "draft_proposed": 4,
                    "draft_accepted": 1,
                    "draft_rejections": 1,
                    "latency_s": 0.01,
                    "created_at": utcnow(),
                }
                for item_id, seq in items
                if seq < done_below
            ],
        )
        session.execute(
            update(Item).where(Item.job_id == job_id, Item.seq < done_below).values(status="done")
        )
        session.execute(
            update(Item).where(Item.job_id == job_id, Item.seq >= done_below).values(status="failed")
        )
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="completed", done=done_below, failed=ITEMS - done_below, finished_at=utcnow())
        )


def content(settings: Settings, file_id: str) -> list[dict]:
    with session_scope(settings.database_url) as session:
        data = b"".join(file_store.iter_content(session, file_id=file_id))
    return [json.loads(line) for line in data.splitlines()]


def test_output_and_error_files_are_written_once_in_input_order(big_settings: Settings) -> None:
    api_settings = big_settings
    batch_id, job_id = make_batch(api_settings)
    with session_scope(api_settings.database_url) as session:
        running = batches.batch_object(session, batches.get_batch(session, batch_id=batch_id, owner=None))
    assert (running["status"], running["request_counts"]["total"]) == ("in_progress", ITEMS), running[
        "errors"
    ]
    finish(api_settings, job_id, done_below=ITEMS - 10)
    for _ in range(2):  # idempotent: the second call finds the files
        batch_files.write_outputs(api_settings, batch_id=batch_id)
    with session_scope(api_settings.database_url) as session:
        ended = batches.batch_object(session, batches.get_batch(session, batch_id=batch_id, owner=None))
        assert len(file_store.job_files(session, job_id=job_id)) == 2
    assert ended["status"] == "completed"
    assert ended["request_counts"] == {"total": ITEMS, "completed": ITEMS - 10, "failed": 10}
    assert ended["usage"]["input_tokens"] == 2 * (ITEMS - 10)
    output = content(api_settings, ended["output_file_id"])
    assert [line["custom_id"] for line in output] == [f"r{i}" for i in range(ITEMS - 10)]
    details = output[0]["response"]["body"]["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 1, "rejected_prediction_tokens": 3}
    errors = content(api_settings, ended["error_file_id"])
    assert [(line["custom_id"], line["error"]["code"]) for line in errors] == [
        (f"r{i}", "item_failed") for i in range(ITEMS - 10, ITEMS)
    ]


def test_status_follows_the_job(big_settings: Settings) -> None:
    api_settings = big_settings
    batch_id, job_id = make_batch(api_settings, owner="key-status")

    def status() -> str:
        batch_files.write_outputs(api_settings, batch_id=batch_id)
        with session_scope(api_settings.database_url) as session:
            return batches.batch_object(session, batches.get_batch(session, batch_id=batch_id, owner=None))[
                "status"
            ]

    with session_scope(api_settings.database_url) as session:
        first = session.query(Item).filter(Item.job_id == job_id, Item.seq == 0).one()
        first.status = "running"
        assert store.cancel_job(session, job=session.get(Job, job_id))
    assert status() == "cancelling"  # one request still finishing
    with session_scope(api_settings.database_url) as session:
        session.execute(update(Item).where(Item.job_id == job_id, Item.seq == 0).values(status="done"))
    assert status() == "cancelled"
    with session_scope(api_settings.database_url) as session:
        session.execute(update(Job).where(Job.id == job_id).values(status="expired"))
    assert status() == "expired"
