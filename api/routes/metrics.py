"""``GET /metrics``: the API's Prometheus metrics (``genjob.api.metrics``): server-wide figures, so an
admin key's where admin keys are configured (``require_operator``), else any key's."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from genjob.api.deps import require_operator
from genjob.telemetry import exposition

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=[Depends(require_operator)],
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Requests, jobs submitted, jobs by status, open items, queue depth and uploads being received
    (Prometheus text format)."""
    body, content_type = await run_in_threadpool(exposition, request.app.state.metrics.registry)
    return Response(body, media_type=content_type)
