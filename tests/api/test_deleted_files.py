"""A deleted file stays deleted: the official SDK, in-process, deletes an ended batch's output file; the
batch's ``output_file_id`` still names it (as OpenAI's does), reading it answers 404, and no read of
the batch writes it again under a new id."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from genjob.api.app import create_app
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store import files as file_store
from genjob.tables import File, FileChunk, Item, Job, utcnow
from tests.support.api import API_KEY, jsonl
from tests.support.store import result_of

LINES = [
    {"custom_id": f"r{i}", "body": {"model": "tiny", "prompt": f"p{i}", "max_tokens": 2}} for i in range(3)
]


@pytest.fixture
def sdk(api_settings: Settings) -> Iterator[openai.OpenAI]:
    with TestClient(create_app(api_settings)) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key=API_KEY, http_client=http, max_retries=0)


def finish(settings: Settings, job_id: str) -> None:
    """Items 0 and 1 done (with results), item 2 failed; the job completed."""
    with session_scope(settings.database_url) as session:
        items = session.execute(select(Item.id, Item.seq).where(Item.job_id == job_id)).all()
        for item_id, seq in items:
            if seq < 2:
                session.add(
                    result_of(
                        job_id=job_id,
                        item_id=item_id,
                        output=f"out {seq}",
                        new_tokens=2,
                        target_rounds=2,
                        latency_s=0.01,
                        created_at=utcnow(),
                    )
                )
        session.execute(update(Item).where(Item.job_id == job_id, Item.seq < 2).values(status="done"))
        session.execute(update(Item).where(Item.job_id == job_id, Item.seq == 2).values(status="failed"))
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(status="completed", done=2, failed=1, finished_at=utcnow())
        )


def test_a_deleted_output_file_stays_deleted(sdk: openai.OpenAI, api_settings: Settings) -> None:
    uploaded = sdk.files.create(file=("requests.jsonl", jsonl(LINES)), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    assert batch.status == "in_progress"
    finish(api_settings, batch.model_extra["genjob"]["job_id"])  # type: ignore[index]
    ended = sdk.batches.retrieve(batch.id)
    assert ended.status == "completed"
    output_id, error_id = ended.output_file_id, ended.error_file_id
    assert output_id is not None and error_id is not None
    assert [
        line.split('"custom_id": ')[1][:4] for line in sdk.files.content(output_id).text.splitlines()
    ] == [
        '"r0"',
        '"r1"',
    ]

    assert sdk.files.delete(output_id).deleted
    for _ in range(2):  # reads of the batch do not write it again
        again = sdk.batches.retrieve(batch.id)
        assert (again.status, again.output_file_id, again.error_file_id) == ("completed", output_id, error_id)
    listed = sdk.batches.list().data
    assert [(b.id, b.output_file_id) for b in listed] == [(batch.id, output_id)]
    with pytest.raises(openai.NotFoundError):
        sdk.files.retrieve(output_id)
    with pytest.raises(openai.NotFoundError):
        sdk.files.content(output_id)
    with pytest.raises(openai.NotFoundError):
        sdk.files.delete(output_id)
    assert output_id not in {file.id for file in sdk.files.list()}
    assert error_id in {file.id for file in sdk.files.list()}
    assert "r2" in sdk.files.content(error_id).text  # the other file is untouched

    with session_scope(api_settings.database_url) as session:
        job_id = batch.model_extra["genjob"]["job_id"]  # type: ignore[index]
        files = file_store.job_files(session, job_id=job_id)
        assert sorted(file.id for file in files.values()) == sorted([output_id, error_id])  # none made anew
        assert session.get(File, output_id).deleted_at is not None  # type: ignore[union-attr]
        chunks = select(func.count()).select_from(FileChunk).where(FileChunk.file_id == output_id)
        assert session.scalar(chunks) == 0  # its content is gone


def test_a_deleted_upload_is_gone(sdk: openai.OpenAI, api_settings: Settings) -> None:
    uploaded = sdk.files.create(file=("requests.jsonl", jsonl(LINES)), purpose="batch")
    assert sdk.files.delete(uploaded.id).deleted
    with session_scope(api_settings.database_url) as session:
        assert session.get(File, uploaded.id) is None
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    assert caught.value.param == "input_file_id"
