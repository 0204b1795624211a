"""The HTTP application: the routes of the served task (serving/tasks/) and the shared protocol
surfaces (serving/routes/: Open Inference Protocol v2, OpenAI model list, the front door `GET /`,
metrics, OpenAPI),
each wrapped with auth, the error table and metrics (serving/http.py). Transport only: parsing,
checking, shaping answers. Scheduling is the batcher's job; running the model is the backend's.

The lifespan starts the model service (the warm-up overlaps the port opening, so liveness
answers at once) and drains it on shutdown. `serving_app` adds the metrics port: with
--metrics-port, connections to that port reach only /metrics, without the API key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ortpack.kernel.bundle import Manifest
from ortpack.serving.config import ServeConfig
from ortpack.serving.errors import MethodNotAllowedError, RouteNotFoundError, ServeError, status_of
from ortpack.serving.http import Handler, RouteSpec, endpoint, error_response, request_id_of
from ortpack.serving.openapi import openapi_document
from ortpack.serving.routes import openai, ops, v2
from ortpack.serving.service import ModelService
from ortpack.serving.tasks import TaskRuntime

log = logging.getLogger("ortpack.serve")


def route_specs(service: ModelService) -> list[RouteSpec]:
    """Every route this server answers: the task's own first, then the shared surfaces."""
    return runtime_routes(service.runtime, service.manifest)


def runtime_routes(runtime: TaskRuntime, manifest: Manifest) -> list[RouteSpec]:
    inputs = [t.v2(manifest.sizes) for t in manifest.signature.served_inputs]
    return [*runtime.routes(), *openai.ROUTES, *v2.routes_for(inputs), *ops.ROUTES]


def openapi_for(runtime: TaskRuntime, manifest: Manifest, model_name: str) -> dict[str, Any]:
    """The OpenAPI document of the routes a server of this task registers (tests/golden/ holds one
    per task: `python -m tests.openapi_golden` regenerates them)."""
    return openapi_document(
        runtime_routes(runtime, manifest),
        {**v2.SCHEMAS, **runtime.schemas()},
        model_name=model_name,
        description=runtime.describe(),
    )


def _errors(routes: list[Route], service: ModelService) -> dict[Any, Callable[..., Any]]:
    """404, 405 and unexpected errors in the one JSON shape. A path with a trailing slash that
    names a route without it is redirected (307) to a relative Location: the Host header is
    never echoed (Starlette's own redirect builds an absolute URL from it)."""
    metrics = service.metrics

    async def http_error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        path = request.url.path
        if code == 404 and len(path) > 1 and path.endswith("/"):
            alternative = {**request.scope, "path": path.rstrip("/")}
            if any(route.matches(alternative)[0] != Match.NONE for route in routes):
                query = request.scope.get("query_string", b"").decode("latin-1")
                location = path.rstrip("/") + (f"?{query}" if query else "")
                metrics.requests.labels(route="unmatched", status="307").inc()
                return Response(status_code=307, headers={"Location": location, "x-request-id": request_id_of(request)})
        error: ServeError = (
            MethodNotAllowedError(f"{request.method} is not allowed on {path}")
            if code == 405
            else RouteNotFoundError(f"no route {path}")
            if code == 404
            else ServeError(f"HTTP {code}" if code != 500 else f"internal error: {type(exc).__name__}")
        )
        metrics.requests.labels(route="unmatched", status=str(status_of(error))).inc()
        response = error_response(error)
        response.headers["x-request-id"] = request_id_of(request)
        return response

    return {404: http_error, 405: http_error, Exception: http_error}


class ExactRoutes:
    """The app, with the routes that have no path parameter found by one dict lookup on (method,
    path) and their handler called at once; everything else (a path parameter, HEAD, a trailing
    slash, 404 and 405, the lifespan) goes through Starlette. Every handler is `endpoint`'s
    (serving/http.py), which answers every error itself in the JSON shape, so Starlette's error
    middleware and router have nothing to add on these paths: they cost the event loop ~9 µs per
    request (a `GET /v2/health/live` in-process: 19-22 µs through here, 28-30 through Starlette)."""

    def __init__(self, app: Starlette, handlers: dict[tuple[str, str], Handler]) -> None:
        self.app = app
        self.handlers = handlers
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            handler = self.handlers.get((scope["method"], scope["path"]))
            if handler is not None:
                scope["app"] = self.app  # what Starlette sets: `request.app.state` finds the service
                response = await handler(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(service: ModelService, config: ServeConfig, on_ready: Callable[[], None] | None = None) -> ExactRoutes:
    specs = route_specs(service)
    metrics = service.metrics
    handlers = [endpoint(s, config, metrics) for s in specs]
    routes = [Route(s.path, handler, methods=[s.method]) for s, handler in zip(specs, handlers, strict=True)]
    exact: dict[tuple[str, str], Handler] = {}
    for spec, handler in zip(specs, handlers, strict=True):
        if "{" not in spec.path:
            exact.setdefault((spec.method, spec.path), handler)  # the first, as Starlette's router

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async def start() -> None:
            await service.start(config)
            if on_ready is not None:
                on_ready()

        warm = asyncio.get_running_loop().create_task(start())  # the port opens meanwhile
        try:
            yield
        finally:
            warm.cancel()
            await service.stop()

    app = Starlette(routes=routes, exception_handlers=_errors(routes, service), lifespan=lifespan)
    app.router.redirect_slashes = False
    app.state.service = service
    app.state.config = config
    app.state.openapi = openapi_for(service.runtime, service.manifest, service.model_name)
    return ExactRoutes(app, exact)


def metrics_app(service: ModelService, config: ServeConfig) -> Starlette:
    """What the metrics port serves: GET /metrics, no API key; anything else 404."""
    spec = dataclasses.replace(ops.METRICS, guarded=False)
    routes = [Route(spec.path, endpoint(spec, config, service.metrics), methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers=_errors(routes, service))
    app.router.redirect_slashes = False
    app.state.service = service
    app.state.config = config
    return app


class PortRouter:
    """Requests that arrived on `port` go to `side`; everything else (lifespan too) to `main`."""

    def __init__(self, main: ExactRoutes, side: ASGIApp, port: int) -> None:
        self.main, self.side, self.port = main, side, port
        self.state = main.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if scope["type"] == "http" and server is not None and server[1] == self.port:
            await self.side(scope, receive, send)
        else:
            await self.main(scope, receive, send)


def serving_app(service: ModelService, config: ServeConfig, on_ready: Callable[[], None] | None = None) -> ASGIApp:
    """The application `ortpack-serve` runs: `create_app`, plus the metrics port when one is set."""
    app = create_app(service, config, on_ready)
    if not config.metrics_port:
        return app
    return PortRouter(app, metrics_app(service, config), config.metrics_port)
