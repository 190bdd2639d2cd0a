"""The FastAPI app: ``create_app(settings)`` builds it, ``serve`` runs it with uvicorn (``genjob api``).

One Settings object (on ``app.state``), one engine per database URL (``genjob.db``), typed
dependencies (``api.deps``). Without API keys the API runs in local-only mode: it listens on
127.0.0.1 only, serves loopback clients only, and says so loudly when it starts.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool

from genjob import __version__
from genjob.api.deps import is_loopback
from genjob.api.errors import install_error_handlers
from genjob.api.metrics import install_metrics
from genjob.api.routes import health, jobs, metrics, results
from genjob.settings import Settings, get_settings
from genjob.submit import prepare_database

log = logging.getLogger(__name__)

LOCAL_ONLY_WARNING = (
    "no API keys configured (GENJOB_API_KEYS): LOCAL-ONLY MODE, no authentication; "
    "listening on loopback only and serving loopback clients only"
)


class UnsafeBind(ValueError):
    """Listening beyond loopback without API keys would serve anyone unauthenticated."""


def check_bind(settings: Settings, host: str) -> None:
    if settings.local_only and not is_loopback(host):
        raise UnsafeBind(
            f"refusing to listen on {host} without API keys: set GENJOB_API_KEYS "
            "(without keys the API is local-only, on 127.0.0.1)"
        )


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if settings.local_only:
        log.warning(LOCAL_ONLY_WARNING)
    await run_in_threadpool(prepare_database, settings)  # a stale schema stops the start-up
    yield


def create_app(settings: Settings | None = None) -> FastAPI:
    """The API for ``settings`` (default: read from the environment)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="genjob",
        version=__version__,
        summary="Batch LLM generation jobs made fast with assisted generation.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    install_metrics(app, settings)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(results.router)
    app.include_router(metrics.router)
    app.openapi = lambda: _openapi_with_model_names(app)  # type: ignore[method-assign]  # FastAPI's way
    return app


def _openapi_with_model_names(app: FastAPI) -> dict:
    """The generated spec, with the allow-listed model names as the enum of ``model`` and ``assistant``."""
    if app.openapi_schema is None:
        spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        names = [entry.name for entry in app.state.settings.models]
        for parameter in spec["paths"]["/v1/jobs"]["post"]["parameters"]:
            if parameter["name"] in ("model", "assistant") and names:
                parameter["schema"]["enum"] = names
        app.openapi_schema = spec
    return app.openapi_schema


def serve(settings: Settings, *, host: str, port: int, log_level: str = "info") -> None:
    """Run the API with uvicorn until interrupted; refuses an unsafe bind (``UnsafeBind``)."""
    import uvicorn

    check_bind(settings, host)
    uvicorn.run(create_app(settings), host=host, port=port, log_level=log_level, server_header=False)
