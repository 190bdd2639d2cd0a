"""Typed dependencies: the app's Settings, a database session per request, the caller, the job.

The caller is who the API key says: its ``owner`` id (``key-`` and 12 hex digits of the key's
sha256, never the key) owns what it makes, and sees only that; an admin key (GENJOB_ADMIN_API_KEYS)
sees every owner's, the CLI's (owner ``local``) too. Without keys (local-only mode) the caller is
``local`` and sees everything. Another owner's job, file or batch is answered 404, as if absent.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from genjob import store
from genjob.api.errors import ApiError
from genjob.db import session_scope
from genjob.settings import Settings
from genjob.tables import LOCAL_OWNER, Job

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


@dataclass(frozen=True)
class Caller:
    owner: str  # owns what it makes
    admin: bool = False  # sees every owner's

    @property
    def scope(self) -> str | None:
        """The owner whose things it may see; None: everyone's."""
        return None if self.admin else self.owner


def owner_of_key(key: str) -> str:
    """The owner id of an API key: stable, and no secret (a prefix of its sha256)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _matches(given: bytes, keys: tuple) -> bool:
    return any(hmac.compare_digest(given, key.get_secret_value().encode()) for key in keys)


def require_api_key(
    request: Request,
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    """``Authorization: Bearer <key>`` with a configured key; without keys, loopback clients only."""
    if settings.local_only:
        client = request.client.host if request.client else None
        if not is_loopback(client):
            raise ApiError(
                403,
                "forbidden",
                "local-only mode (no GENJOB_API_KEYS configured): only loopback clients are served",
            )
        return Caller(LOCAL_OWNER, admin=True)
    if credentials is None:
        raise ApiError(
            401,
            "unauthorized",
            "missing API key: send Authorization: Bearer <key>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    given = credentials.credentials.encode()
    owner = owner_of_key(credentials.credentials)
    if _matches(given, settings.admin_api_keys):
        return Caller(owner, admin=True)
    if _matches(given, settings.api_keys):
        return Caller(owner)
    raise ApiError(401, "unauthorized", "invalid API key", headers={"WWW-Authenticate": "Bearer"})


CallerDep = Annotated[Caller, Depends(require_api_key)]


def require_operator(caller: CallerDep, settings: SettingsDep) -> Caller:
    """A caller who may see server-wide figures (every tenant's jobs, queues): an admin key where admin
    keys are configured; where none is, every key is the one tenant's operator's."""
    if settings.admin_api_keys and not caller.admin:
        raise ApiError(403, "forbidden", "server-wide figures need an admin key (GENJOB_ADMIN_API_KEYS)")
    return caller


JOB_ID = re.compile(r"[0-9a-f]{1,32}")

JobIdPath = Annotated[
    str,
    Path(
        description="The job id (or a unique prefix of it among your jobs), as POST /v1/jobs returned it.",
        examples=["3f2a9c81d0b4"],
    ),
]


def get_job(job_id: JobIdPath, session: SessionDep, caller: CallerDep) -> Job:
    """The caller's job with this id or unique prefix; 404 for anything else, another owner's too."""
    try:
        if not JOB_ID.fullmatch(job_id):
            raise store.JobNotFound(job_id)
        return store.get_job(session, job_id=job_id, owner=caller.scope)
    except store.JobNotFound as exc:
        raise ApiError(404, "not_found", str(exc)) from exc


JobDep = Annotated[Job, Depends(get_job)]
