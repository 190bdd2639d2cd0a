"""The sweeper's broker marker: one key per database, however its URL is spelled."""

from __future__ import annotations

from genjob.constants import BROKER_MARK_KEY
from genjob.worker.sweeper import broker_mark_key


def test_marker_key_names_the_database_not_the_url_spelling() -> None:
    spellings = [
        "postgresql+psycopg://postgres@127.0.0.1:5432/genjob",
        "postgresql://postgres:secret@127.0.0.1:5432/genjob",
        "postgresql+psycopg://worker@127.0.0.1:5432/genjob?application_name=gpu-1&sslmode=disable",
    ]
    keys = {broker_mark_key(url) for url in spellings}
    assert len(keys) == 1
    assert keys.pop().startswith(f"{BROKER_MARK_KEY}:")


def test_marker_key_differs_between_databases() -> None:
    keys = {
        broker_mark_key("postgresql+psycopg://postgres@127.0.0.1:5432/genjob"),
        broker_mark_key("postgresql+psycopg://postgres@127.0.0.1:5432/genjob_staging"),
        broker_mark_key("postgresql+psycopg://postgres@10.0.0.2:5432/genjob"),
        broker_mark_key("sqlite:///genjob.db"),
    }
    assert len(keys) == 4
