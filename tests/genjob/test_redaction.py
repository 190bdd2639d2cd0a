"""``genjob.redaction``: URLs' passwords masked wherever they are written, in text and in log records."""

from __future__ import annotations

import logging

import pytest

from genjob.redaction import install_log_masking, mask_text, mask_url


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:s3cretpw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:s3cretpw@host:6379/0", "redis://:***@host:6379/0"),
        ("postgresql+psycopg://genjob:p%40ss@db/genjob", "postgresql+psycopg://genjob:***@db/genjob"),
        ("rediss://u:a@b@host/0", "rediss://u:***@host/0"),
        ("genjob:s3cretpw@host", "genjob:***@host"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("sqlite:///./a@b.db", "sqlite:///./a@b.db"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_mask_text_hides_urls_and_the_environment_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENJOB_BROKER_URL", "redis://user:Pl4nted@host/0")
    text = "failed on amqp://guest:guest@rabbit:5672// and then: password Pl4nted refused"
    assert mask_text(text) == "failed on amqp://guest:***@rabbit:5672// and then: password *** refused"


def test_log_records_are_masked_with_their_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(logging, "_logRecordFactory", logging.getLogRecordFactory())  # restored after
    install_log_masking()
    install_log_masking()  # a second call changes nothing
    try:
        raise ConnectionError("cannot reach redis://u:Pl4nted@host:1/0")
    except ConnectionError:
        logging.getLogger("genjob.test").exception("broker %s down", "redis://u:Pl4nted@host:1/0")
    assert "Pl4nted" not in caplog.text
    assert "broker redis://u:***@host:1/0 down" in caplog.text
    assert "ConnectionError: cannot reach redis://u:***@host:1/0" in caplog.text
