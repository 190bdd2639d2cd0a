"""``GET /healthz``: can this API reach its database (migrated to head) and its broker?"""

from __future__ import annotations

import logging
from functools import cache

from fastapi import APIRouter, Response
from sqlalchemy import text

from genjob import db
from genjob.api.deps import SettingsDep
from genjob.api.schemas import HealthOut
from genjob.settings import Settings

log = logging.getLogger(__name__)
BROKER_TIMEOUT_S = 3.0

router = APIRouter(tags=["health"])


@cache
def _head_revision() -> str:
    return db.head_revision()


def check_database(settings: Settings) -> str:
    try:
        with db.get_engine(settings.database_url).connect() as connection:
            connection.execute(text("SELECT 1"))
        current = db.current_revision(settings.database_url)
    except Exception as exc:
        log.warning("health: database unreachable: %s", exc)
        return f"unreachable ({type(exc).__name__})"
    if current != _head_revision():
        return f"schema at {current or 'base'}, not {_head_revision()}: run `genjob db upgrade`"
    return "ok"


def check_broker(settings: Settings) -> str:
    if settings.embedded:
        return "embedded"
    from kombu.connection import Connection

    try:
        with Connection(settings.broker_url, connect_timeout=BROKER_TIMEOUT_S) as connection:
            connection.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT_S
            )
    except Exception as exc:
        log.warning("health: broker unreachable: %s", exc)
        return f"unreachable ({type(exc).__name__})"
    return "ok"


@router.get(
    "/healthz",
    summary="Database and broker reachable",
    responses={503: {"model": HealthOut, "description": "A dependency is down."}},
)
def healthz(settings: SettingsDep, response: Response) -> HealthOut:
    """No API key needed (for load balancers and compose healthchecks)."""
    database, broker = check_database(settings), check_broker(settings)
    healthy = database == "ok" and broker in ("ok", "embedded")
    if not healthy:
        response.status_code = 503
    return HealthOut(status="ok" if healthy else "unavailable", database=database, broker=broker)
