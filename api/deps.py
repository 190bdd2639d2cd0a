"""Typed dependencies: the app's Settings, a database session per request, the API key, the job."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from genjob import store
from genjob.api.errors import ApiError
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import Job

bearer = HTTPBearer(auto_error=False, description="An API key from GENJOB_API_KEYS.")


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    """One transaction per request: committed when the endpoint returns, rolled back if it raises."""
    with session_scope(settings.database_url) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


def is_loopback(host: str | None) -> bool:
    """A loopback address or name (None: a Unix socket, local by definition)."""
    if host is None or host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_api_key(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    """``Authorization: Bearer <key>`` with a configured key; without keys, loopback clients only."""
    if settings.local_only:
        client = request.client.host if request.client else None
        if not is_loopback(client):
            raise ApiError(
                403,
                "forbidden",
                "local-only mode (no GENJOB_API_KEYS configured): only loopback clients are served",
            )
        return
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = credentials.credentials.encode()
    if not any(hmac.compare_digest(given, key.get_secret_value().encode()) for key in settings.api_keys):
        raise ApiError(401, "unauthorized", "invalid API key", headers={"WWW-Authenticate": "Bearer"})


JobIdPath = Annotated[
    str,
    Path(
        pattern=r"^[0-9a-f]{1,32}$",
        description="The job id (or a unique prefix of it), as POST /v1/jobs returned it.",
        examples=["3f2a9c81d0b4"],
    ),
]


def get_job(job_id: JobIdPath, session: SessionDep) -> Job:
    try:
        return store.get_job(session, job_id=job_id)
    except store.JobNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc


JobDep = Annotated[Job, Depends(get_job)]
