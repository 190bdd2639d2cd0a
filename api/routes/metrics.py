"""``GET /metrics``: the API's Prometheus metrics (``api.metrics``), behind the same keys as the rest."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from genjob.api.deps import require_api_key
from genjob.telemetry import exposition

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=[Depends(require_api_key)],
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Requests, jobs submitted, jobs by status, open items, queue depth and uploads being received
    (Prometheus text format)."""
    body, content_type = await run_in_threadpool(exposition, request.app.state.metrics.registry)
    return Response(body, media_type=content_type)
