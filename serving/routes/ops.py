"""Operations: Prometheus metrics, the OpenAPI document generated from the registered routes,
and a self-contained /docs page."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from serving.http import RouteSpec, json_response, service_of
from serving.openapi import docs_html


async def prometheus(request: Request) -> Response:
    service = service_of(request)
    service.metrics.queue_depth.set(service.batcher.depth)
    return Response(service.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


async def openapi(request: Request) -> Response:
    return json_response(request.app.state.openapi)


async def docs(request: Request) -> Response:
    return HTMLResponse(docs_html(request.app.state.openapi))


METRICS = RouteSpec(
    path="/metrics",
    method="GET",
    handler=prometheus,
    summary="Prometheus metrics",
    operation_id="metrics",
    extra={"responses": {"200": {"description": "Prometheus text exposition format"}}},
)
ROUTES = [
    METRICS,
    RouteSpec(path="/openapi.json", method="GET", handler=openapi, summary="This document", operation_id="openapi"),
    RouteSpec(path="/docs", method="GET", handler=docs, summary="The routes, as a page", operation_id="docs"),
]
