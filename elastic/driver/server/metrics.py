"""`/metrics`: the job's Prometheus metrics, read-only and without the token (nothing in them
is secret: see `elastic.driver.observe.prometheus`)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response

from elastic.driver.observe.prometheus import JobMetrics
from elastic.driver.server.auth import ServicesDep

PATH = "/metrics"

router = APIRouter(tags=["metrics"])


@router.get(PATH, response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(svc: ServicesDep) -> Response:
    if svc.metrics is None:
        raise HTTPException(404, "this driver serves no metrics")
    return Response(await svc.metrics(), media_type=JobMetrics.CONTENT_TYPE)
