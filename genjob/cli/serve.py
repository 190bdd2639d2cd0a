"""Service commands: the HTTP API and the Flower dashboard."""

from __future__ import annotations

import os

import click

from genjob.cli.extras import needs_extra, require_extra
from genjob.db import SchemaError
from genjob.settings import get_settings
from genjob.submit import prepare_database

FLOWER_AUTH_OPTIONS = ("--basic-auth", "--basic_auth", "--auth")
FLOWER_AUTH_ENV = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")


@click.command()
@click.option("--host", help="Address to listen on (default: GENJOB_API_HOST, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default: GENJOB_API_PORT, 8000).")
@click.option("--log-level", default="info", show_default=True, help="Granian's log level.")
def api(host: str | None, port: int | None, log_level: str) -> None:
    """Serve the HTTP API (FastAPI on Granian): POST /v1/jobs and friends.

    Clients authenticate with Authorization: Bearer KEY, a key from
    GENJOB_API_KEYS. Without keys the API is local-only: it listens on
    127.0.0.1, serves loopback clients only, and refuses any other --host.
    A port another server listens on is refused (rather than shared).
    Jobs name their model from the allow-list (GENJOB_MODELS, and the
    built-in smollm2). The OpenAPI spec is at /openapi.json, the docs at
    /docs.
    """
    require_extra("api", "api")  # a base install: one line naming genjob[api], not a traceback
    with needs_extra("api", "api"):
        from genjob.api.app import CannotListen, UnsafeBind, serve

    settings = get_settings()
    try:
        prepare_database(settings)
        serve(settings, host=host or settings.api_host, port=port or settings.api_port, log_level=log_level)
    except (SchemaError, UnsafeBind, CannotListen) as exc:
        raise click.ClickException(str(exc)) from exc


def _is_loopback(address: str) -> bool:
    from genjob.api.deps import is_loopback

    return is_loopback(address)


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--address", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=5555, show_default=True)
@click.argument("flower_args", nargs=-1, type=click.UNPROCESSED)
def flower(address: str, port: int, flower_args: tuple[str, ...]) -> None:
    """Run Flower, the Celery dashboard, on the broker the workers use.

    It shows the workers and every chunk task (genjob.generate_chunk; its
    arguments read job=ID items 0-63). A chunk that went well is a SUCCESS
    whose result starts with its kind, clean or stopped; one with items that
    failed (or whose worker failed) is a FAILURE, its kind and counts in its
    exception: WITH FAILURES or WORKER FAULT. It is not run again. Listening
    beyond loopback needs authentication: --basic-auth=user:password (or
    FLOWER_BASIC_AUTH). Its HTTP API (/api/...)
    also needs authentication, or FLOWER_UNAUTHENTICATED_API=true. Extra
    arguments go to Flower as they are.
    """
    settings = get_settings()
    if settings.embedded:
        raise click.ClickException("GENJOB_BROKER_URL is not set: Flower watches the workers of a broker")
    authenticated = any(arg.startswith(FLOWER_AUTH_OPTIONS) for arg in flower_args) or any(
        os.environ.get(name) for name in FLOWER_AUTH_ENV
    )
    if not authenticated and not _is_loopback(address):
        raise click.ClickException(
            f"refusing to serve Flower on {address} without authentication: "
            "pass --basic-auth=user:password or set FLOWER_BASIC_AUTH"
        )
    from genjob.worker.celery_app import create_app

    create_app(settings).start(["flower", f"--address={address}", f"--port={port}", *flower_args])


COMMANDS = (api, flower)
