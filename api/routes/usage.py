"""``GET /v1/usage``: requests and tokens per API key (owner) over a period; admin keys see every owner's."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from genjob.api.deps import CallerDep, SessionDep, SettingsDep
from genjob.api.errors import error_responses
from genjob.store.usage import usage_by_owner
from genjob.tables import utcnow

router = APIRouter(prefix="/v1/usage", tags=["usage"], responses=error_responses(401, 403, 422))


class OwnerUsage(BaseModel):
    owner: str = Field(description="The API key's owner id (key-…), or local (the CLI).")
    jobs: int = Field(description="Jobs and batches submitted in the period.")
    requests: int = Field(description="Requests (items) that ended done or failed in the period.")
    failed_requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class UsageOut(BaseModel):
    object: str = "list"
    days: int
    quota_tokens: int | None = Field(description="GENJOB_API_QUOTA_TOKENS: tokens per key over 30 days.")
    data: list[OwnerUsage]


@router.get("", summary="Usage per API key: requests, prompt and completion tokens")
def get_usage(
    session: SessionDep,
    settings: SettingsDep,
    caller: CallerDep,
    days: Annotated[int, Query(ge=1, le=3660, description="The period: the last N days.")] = 30,
    owner: Annotated[str | None, Query(max_length=100, description="Admin keys: one owner only.")] = None,
) -> UsageOut:
    """Your key's usage (an admin key: every owner's, or `owner`'s). The quota counts the last 30 days."""
    scope = caller.owner if not caller.admin else owner
    rows = usage_by_owner(session, since=utcnow() - timedelta(days=days), owner=scope)
    data = [OwnerUsage(**{**row.__dict__, "total_tokens": row.total_tokens}) for row in rows]
    return UsageOut(days=days, quota_tokens=settings.api_quota_tokens, data=data)
