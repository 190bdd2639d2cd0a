"""What a worker holds of an item it claimed (``ClaimedItem``), declared once: the claim's SQL in
``genjob.store.items`` (Core, every backend) and ``genjob.store.postgres_groups`` (one statement)
returns the columns ``CLAIMED_COLUMNS`` names, read from this dataclass; ``Refused`` says why a claim
took nothing. Must not know: Celery, torch, the HTTP API or the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum


class Refused(StrEnum):
    """Why a claim claimed nothing at all."""

    JOB_ENDED = "job ended"  # its job was cancelled, failed or expired: the chunk stops


@dataclass(frozen=True)
class ClaimedItem:
    """What a worker needs of an item it claimed: its prompt, and the fence it must finish with.
    Every field but ``job_id`` and ``started_at`` (the claim's own) is the ``items`` column of its name."""

    id: int
    job_id: str
    seq: int
    prompt: str
    max_new_tokens: int | None
    attempts: int
    fence: int
    started_at: datetime
    error: str | None = None  # the last try's error, if any
    # The line's own sampling settings (OpenAI batch lines); None: the job's.
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None


# The ``items`` columns a claim returns, in this order.
CLAIMED_COLUMNS = tuple(
    field.name for field in fields(ClaimedItem) if field.name not in ("job_id", "started_at")
)
