"""The optional per-key quota (GENJOB_API_QUOTA_TOKENS): prompt + completion tokens over 30 days.

Checked before a new job or batch is stored; past it the API answers 429 ``quota_exceeded``.
Usage itself is read from the results (``genjob.store.usage``).
"""

from __future__ import annotations

from datetime import timedelta

from genjob.api.errors import ApiError
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.store.usage import usage_by_owner
from genjob.tables import utcnow

QUOTA_PERIOD = timedelta(days=30)


def check_quota(settings: Settings, owner: str) -> None:
    """429 if ``owner`` already used its quota of tokens over the last QUOTA_PERIOD."""
    quota = settings.api_quota_tokens
    if quota is None:
        return
    with session_scope(settings.database_url) as session:
        (usage,) = usage_by_owner(session, since=utcnow() - QUOTA_PERIOD, owner=owner)
    if usage.total_tokens >= quota:
        raise ApiError(
            429,
            "quota_exceeded",
            f"this API key used {usage.total_tokens} tokens in the last 30 days, its quota is {quota} "
            "(GENJOB_API_QUOTA_TOKENS): no new jobs or batches until usage falls below it",
            headers={"Retry-After": "3600"},
        )
