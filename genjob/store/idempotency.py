"""Idempotency keys: a client's retry of a submit (or a batch creation) gets what the first try made.

A key is scoped to its owner (the API key; ``local`` for the CLI) and to what it creates (``jobs`` or
``batches``), and remembered with the fingerprint of the request's content for as long as what it
made exists (deleting the job forgets the key with it, so at least as long as ``genjob purge`` keeps
jobs: never less than 24 hours unless someone deletes the job). The
key's row is inserted *before* the job in the same transaction, so a concurrent second try with the
same key waits on the first one's row and then finds it: never a second job.
Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import BinaryIO

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from genjob.tables import IdempotencyKey

MAX_KEY_CHARS = 255
HASH_BLOCK = 1 << 20


class IdempotencyConflict(ValueError):
    """The key was used before with other content (409): a retry must send the same request."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"the idempotency key {key!r} was already used with a different request; "
            "send the same request to get its result, or use a new key"
        )
        self.key = key


@dataclass(frozen=True)
class Idempotency:
    """A key given with a request, and the fingerprint of that request's content."""

    owner: str
    scope: str  # "jobs" or "batches"
    key: str
    fingerprint: str


def fingerprint(header: str, stream: BinaryIO | None = None) -> str:
    """sha256 of ``header`` (the request's options, canonical JSON) and the stream's bytes from its
    current position (which is restored)."""
    digest = hashlib.sha256(header.encode())
    if stream is not None:
        start = stream.tell()
        while block := stream.read(HASH_BLOCK):
            digest.update(block)
        stream.seek(start)
    return digest.hexdigest()


def _row(session: Session, idempotency: Idempotency) -> IdempotencyKey | None:
    return session.get(
        IdempotencyKey, (idempotency.owner, idempotency.scope, idempotency.key), populate_existing=True
    )


def remembered(session: Session, *, idempotency: Idempotency) -> str | None:
    """The job or batch id the key made, None if the key is new; IdempotencyConflict if it was used
    with other content. A key whose job or batch is gone (deleted) counts as new."""
    row = _row(session, idempotency)
    if row is None:
        return None
    made = row.job_id or row.batch_id
    if made is None:
        return None
    if row.fingerprint != idempotency.fingerprint:
        raise IdempotencyConflict(idempotency.key)
    return made


def claim(session: Session, *, idempotency: Idempotency) -> None:
    """Insert the key's row (in the caller's transaction, before what it makes): a concurrent claim of
    the same key waits for this transaction and then fails with IntegrityError."""
    session.add(
        IdempotencyKey(
            owner=idempotency.owner,
            scope=idempotency.scope,
            key=idempotency.key,
            fingerprint=idempotency.fingerprint,
        )
    )
    session.flush()


def bind(
    session: Session, *, idempotency: Idempotency, job_id: str | None = None, batch_id: str | None = None
) -> None:
    """Record what the claimed key made."""
    session.execute(
        update(IdempotencyKey)
        .where(
            IdempotencyKey.owner == idempotency.owner,
            IdempotencyKey.scope == idempotency.scope,
            IdempotencyKey.key == idempotency.key,
        )
        .values(job_id=job_id, batch_id=batch_id)
    )


def is_duplicate(exc: IntegrityError) -> bool:
    """Whether an IntegrityError is a concurrent claim of the same key (its primary key)."""
    text = str(exc.orig).lower()
    return "idempotency_keys" in text or "unique" in text or "duplicate" in text
