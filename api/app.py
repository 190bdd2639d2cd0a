"""The FastAPI app: ``create_app(settings)`` builds it, ``serve`` runs it on Granian (``genjob api``).

One Settings object (on ``app.state``), one engine per database URL (``genjob.db``), typed
dependencies (``genjob.api.deps``). Without API keys the API runs in local-only mode: it listens on
127.0.0.1 only, serves loopback clients only, and says so loudly when it starts. The OpenAPI spec
(``/openapi.json``) and the docs (``/docs``, the spec inlined) take the same key as every route.
Granian bounds the time to send request headers and the connections served at once;
``genjob.api.limits`` bounds body reads, ``genjob.api.uploads`` the uploads spooled at once.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from genjob import __version__
from genjob.api.deps import is_loopback, require_api_key
from genjob.api.errors import install_error_handlers
from genjob.api.limits import BodyTimeoutMiddleware
from genjob.api.metrics import install_metrics
from genjob.api.routes import batches, files, health, jobs, metrics, results, usage
from genjob.api.uploads import UploadSlots
from genjob.redaction import install_log_masking, remember_url
from genjob.settings import Settings, get_settings
from genjob.submit import prepare_database

log = logging.getLogger(__name__)

LOCAL_ONLY_WARNING = (
    "no API keys configured (GENJOB_API_KEYS): LOCAL-ONLY MODE, no authentication; "
    "listening on loopback only and serving loopback clients only"
)


def describe(settings: Settings) -> str:
    """The spec's description: what the API is, and its limits with this server's values."""
    return f"""Batch LLM generation jobs made fast with assisted generation, and the OpenAI Files and
Batches APIs (`base_url=".../v1"` in the official SDK).

**Limits** (the setting in brackets): request headers must be all in within
{settings.api_header_timeout_s:g} s (GENJOB_API_HEADER_TIMEOUT_S, else the connection is closed); a
request body may send nothing for at most {settings.api_body_timeout_s:g} s (GENJOB_API_BODY_TIMEOUT_S:
408); {settings.api_max_connections} connections are served at once (GENJOB_API_MAX_CONNECTIONS: more
wait); {settings.api_max_uploads} uploads are spooled at once (GENJOB_API_MAX_UPLOADS: 503), so
uploads take at most {settings.api_max_uploads} × {settings.max_upload_bytes} bytes of disk; an upload
is at most {settings.max_upload_bytes} bytes (GENJOB_MAX_UPLOAD_BYTES: 413, checked while it streams),
a line at most {settings.max_line_bytes} bytes; tokens per key over 30 days:
{settings.api_quota_tokens or "no quota"} (GENJOB_API_QUOTA_TOKENS: 429).

Everything you create belongs to your API key: another key gets 404 for it (admin keys,
GENJOB_ADMIN_API_KEYS, see everything)."""


class UnsafeBind(ValueError):
    """Listening beyond loopback without API keys would serve anyone unauthenticated."""


def check_bind(settings: Settings, host: str) -> None:
    if settings.local_only and not is_loopback(host):
        raise UnsafeBind(
            f"refusing to listen on {host} without API keys: set GENJOB_API_KEYS "
            "(without keys the API is local-only, on 127.0.0.1)"
        )


class CannotListen(OSError):
    """The address cannot be listened on: another server has the port, or the host is not this machine's."""


def check_port(host: str, port: int) -> None:
    """Refuse a port another server listens on (``CannotListen``), before Granian binds it.

    Granian binds with SO_REUSEPORT, so a second server on a busy port would start and share it, the
    requests split between the two. A plain socket (SO_REUSEADDR only: a port left in TIME_WAIT is
    free) is bound to the address and closed at once; a server that takes the port in between is
    Granian's to meet.
    """
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(
                f"cannot listen on {where}: the port is in use (another server listens there)"
            ) from exc
        raise CannotListen(f"cannot listen on {where}: {exc.strerror or exc}") from exc


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
    for url in (settings.database_url, settings.broker_url):
        remember_url(url)  # their passwords masked in every log line and message (genjob.redaction)
    install_log_masking()
    app = FastAPI(
        title="genjob",
        version=__version__,
        summary="Batch LLM generation jobs made fast with assisted generation.",
        description=describe(settings),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.settings = settings
    app.state.upload_slots = UploadSlots(settings.api_max_uploads)
    install_error_handlers(app)
    # Inside the metrics middleware (added before it, so nearer the routes): a timeout raised by a read
    # of the body reaches the route as itself, not wrapped in that middleware's task group.
    app.add_middleware(BodyTimeoutMiddleware, seconds=settings.api_body_timeout_s)
    install_metrics(app, settings)
    for module in (health, jobs, results, files, batches, usage, metrics):
        app.include_router(module.router)
    _install_docs(app)
    return app


def _install_docs(app: FastAPI) -> None:
    """``/openapi.json`` and ``/docs`` behind the API key, like every other route."""

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_api_key)])
    def openapi_spec() -> dict:
        return _openapi_with_model_names(app)

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(require_api_key)])
    def docs() -> HTMLResponse:
        # The spec inlined: the browser's fetch of /openapi.json would carry no key.
        spec = _openapi_with_model_names(app)
        return get_swagger_ui_html(openapi_url="", title="genjob API", swagger_ui_parameters={"spec": spec})

    app.openapi = lambda: _openapi_with_model_names(app)  # type: ignore[method-assign]  # FastAPI's way


def _openapi_with_model_names(app: FastAPI) -> dict:
    """The generated spec, with the allow-listed model names as the enum of ``model`` and ``assistant``."""
    if app.openapi_schema is None:
        spec = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        names = [entry.name for entry in app.state.settings.catalog]
        for parameter in spec["paths"]["/v1/jobs"]["post"]["parameters"]:
            if parameter["name"] in ("model", "assistant") and names:
                parameter["schema"]["enum"] = names
        spec.setdefault("components", {})["securitySchemes"] = {
            "HTTPBearer": {"type": "http", "scheme": "bearer", "description": "An API key."}
        }
        app.openapi_schema = spec
    return app.openapi_schema


def app_from_environment() -> FastAPI:
    """The app with Settings read from the environment: Granian's factory, in its worker process."""
    return create_app(get_settings())


def serve(settings: Settings, *, host: str, port: int, log_level: str = "info") -> None:
    """Run the API on Granian until interrupted; refuses an unsafe bind (``UnsafeBind``) and a port
    in use (``CannotListen``).

    Granian's worker process builds the app from the same environment (``app_from_environment``).
    """
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings
    from granian.log import LogLevels

    check_bind(settings, host)
    check_port(host, port)
    if settings.local_only:
        log.warning(LOCAL_ONLY_WARNING)
    Granian(
        "genjob.api.app:app_from_environment",
        factory=True,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        workers=1,
        backpressure=settings.api_max_connections,
        backlog=max(128, settings.api_max_connections),
        http1_settings=HTTP1Settings(header_read_timeout=int(settings.api_header_timeout_s * 1000)),
        log_level=LogLevels(log_level.lower()),
        websockets=False,
    ).serve()
