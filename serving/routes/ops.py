"""Operations: the front door (`GET /`: what is served and where to go, JSON or a page),
Prometheus metrics, the OpenAPI document generated from the registered routes, and a
self-contained /docs page."""

from __future__ import annotations

import html
import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ortpack import __version__
from ortpack.serving.http import RouteSpec, json_response
from ortpack.serving.openapi import docs_html
from ortpack.serving.routes import v2
from ortpack.serving.service import model_service

LINKS = {"docs": "/docs", "openapi": "/openapi.json", "metrics": "/metrics", "ready": "/v2/health/ready"}


def front_door(request: Request) -> dict[str, Any]:
    """What `GET /` says: the model, its task, the variant and version served (with its embedding
    space, text embeddings), and where to go next (the task's own routes and Open Inference
    Protocol inference, with the model's name filled in)."""
    service = model_service(request)
    name = urllib.parse.quote(service.model_name, safe="")
    infer = next(r for r in v2.ROUTES if r.path == "/v2/models/{name}/infer")
    routes = [*service.runtime.routes(), infer]
    space = service.space
    return {
        "name": service.model_name,
        "task": service.manifest.task,
        "variant": service.variant.id,
        "version": service.manifest.version,
        "embedding_space": space.model_dump() if space is not None else None,
        "server": {"name": "ortpack", "version": __version__},
        "ready": service.ready,
        "links": LINKS,
        "routes": [{"method": r.method, "path": r.path.replace("{name}", name), "summary": r.summary} for r in routes],
    }


def _quality(accept: str, media: str) -> float:
    """The q-value `accept` gives `media`, from its most specific matching range (0: none)."""
    kind = media.split("/")[0] + "/*"
    best, quality = -1, 0.0
    for part in accept.split(","):
        fields = [f.strip() for f in part.split(";")]
        rank = {media: 2, kind: 1, "*/*": 0}.get(fields[0].lower(), -1)
        if rank <= best:
            continue
        q = 1.0
        for param in fields[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        best, quality = rank, q
    return quality


def prefers_html(accept: str) -> bool:
    """A browser's Accept (text/html first, */* at a lower q) prefers HTML; curl's */* does not."""
    return _quality(accept, "text/html") > _quality(accept, "application/json")


def index_html(info: dict[str, Any]) -> str:
    def esc(value: object) -> str:
        return html.escape(str(value))

    links = "".join(f"<li><a href='{esc(path)}'>{esc(path)}</a></li>" for path in info["links"].values())
    embedding_space = info.get("embedding_space")
    space = f"<p>embedding space <code>{esc(embedding_space['id'])}</code></p>" if embedding_space else ""
    routes = "".join(
        f"<li><code>{esc(r['method'])} {esc(r['path'])}</code>: {esc(r['summary'])}</li>" for r in info["routes"]
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ortpack server</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:2em}</style></head><body>"
        f"<h1>{esc(info['name'])}</h1><p>{esc(info['task'])}, variant {esc(info['variant'])}, version "
        f"{esc(info['version'])} (ortpack server {esc(info['server']['version'])})</p>{space}"
        f"<ul>{links}</ul><h2>Routes</h2><ul>{routes}</ul>"
        "<p>Send JSON bodies with <code>Content-Type: application/json</code> (anything else is 415); "
        "<a href='/docs'>/docs</a> has an example request for each route.</p></body></html>"
    )


async def index(request: Request) -> Response:
    info = front_door(request)
    vary = {"Vary": "Accept"}
    if prefers_html(request.headers.get("accept", "")):
        return HTMLResponse(index_html(info), headers=vary)
    return json_response(info, headers=vary)


async def prometheus(request: Request) -> Response:
    service = model_service(request)
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
    RouteSpec(
        path="/",
        method="GET",
        handler=index,
        summary="What this server serves and where to go: JSON, or a page when Accept prefers text/html",
        operation_id="index",
    ),
    METRICS,
    RouteSpec(path="/openapi.json", method="GET", handler=openapi, summary="This document", operation_id="openapi"),
    RouteSpec(
        path="/docs",
        method="GET",
        handler=docs,
        summary="The routes, as a page, with example requests",
        operation_id="docs",
    ),
]
