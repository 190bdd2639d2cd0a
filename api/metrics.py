"""The API's Prometheus metrics: requests by route and status, jobs submitted by model (through
``/v1/jobs`` or ``/v1/batches``), scrape-time state from the database and the broker (jobs by status,
open items and queue depth per queue), the uploads being received now, and ``genjob_build_info``.

Each app has its own registry (``app.state.metrics``), so apps built by tests never clash. Labels are
bounded: the route's template (``/v1/jobs/{job_id}``, never the id), the method, the status code,
allow-listed model names. Served at ``GET /metrics`` (``genjob.api.routes.metrics``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from prometheus_client import CollectorRegistry, Counter, Gauge

from genjob.api.uploads import UploadSlots
from genjob.db import session_scope
from genjob.queueing import queue_depths
from genjob.settings import Settings
from genjob.store.activity import state_counts
from genjob.telemetry import BuildInfo, StateCollector

log = logging.getLogger(__name__)


def read_state(settings: Settings) -> dict[str, Any]:
    """What the state gauges show; empty (and logged) when the database cannot be read."""
    try:
        with session_scope(settings.database_url) as session:
            jobs, items = state_counts(session)
    except Exception as exc:
        log.warning("metrics: cannot read the database: %s", exc)
        return {"jobs": {}, "items": {}, "queues": {}}
    queues: dict[str, int] = {}
    if settings.broker_url:
        queues = queue_depths(settings.broker_url, {settings.queue, *(queue for queue, _ in items)})
    return {"jobs": jobs, "items": items, "queues": queues}


class ApiMetrics:
    def __init__(self, settings: Settings, upload_slots: UploadSlots) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "genjob_api_requests",
            "HTTP requests by method, route template and status.",
            ("method", "route", "status"),
            registry=self.registry,
        )
        self.jobs_submitted = Counter(
            "genjob_api_jobs_submitted",
            "Jobs stored through the API (POST /v1/jobs, POST /v1/batches), by model.",
            ("model",),
            registry=self.registry,
        )
        self.uploads_receiving = Gauge(
            "genjob_api_uploads_receiving",
            "Uploads being received now; past GENJOB_API_MAX_UPLOADS more answer 503.",
            registry=self.registry,
        )
        self.uploads_receiving.set_function(lambda: upload_slots.active)
        self.registry.register(StateCollector(lambda: read_state(settings)))
        self.registry.register(BuildInfo())


def install_metrics(app: FastAPI, settings: Settings) -> None:
    metrics = ApiMetrics(settings, app.state.upload_slots)
    app.state.metrics = metrics

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        metrics.requests.labels(request.method, route, str(response.status_code)).inc()
        return response
