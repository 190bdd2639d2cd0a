"""Helpers for the API tests (tests/api): the test API key, JSONL bodies, running queued chunks here."""

from __future__ import annotations

import json

from genjob import store
from genjob.db import session_scope
from genjob.settings import Settings

API_KEY = "test-key-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def run_pending_here(settings: Settings, job_id: str) -> None:
    """Run the job's pending chunks in this process through the worker's own code (no worker needed)."""
    from genjob.worker.chunks import process_chunk

    with session_scope(settings.database_url) as session:
        chunks = list(store.pending_item_chunks(session, job_id=job_id, chunk_size=settings.chunk_size))
    for item_ids in chunks:
        process_chunk(settings=settings, job_id=job_id, item_ids=item_ids, worker="test")


def with_settings(settings: Settings, **changes) -> Settings:
    """``settings`` with some values changed, validated as if read from the environment."""
    values = {name: getattr(settings, name) for name in Settings.model_fields}
    return Settings(**{**values, **changes})
