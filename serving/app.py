"""The HTTP application: the routes of the served task (serving/tasks/) and the shared protocol
surfaces (serving/routes/: Open Inference Protocol v2, OpenAI model list, metrics, OpenAPI),
each wrapped with auth, the error table and metrics (serving/http.py). Transport only: parsing,
checking, shaping answers. Scheduling is the batcher's job; running the model is the backend's.

The lifespan starts the model service (the warm-up overlaps the port opening, so liveness
answers at once) and drains it on shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serving.config import ServeConfig
from serving.errors import MethodNotAllowedError, RouteNotFoundError, ServeError, status_of
from serving.http import RouteSpec, endpoint, error_response
from serving.openapi import openapi_document
from serving.routes import openai, ops, v2
from serving.service import ModelService


def route_specs(service: ModelService) -> list[RouteSpec]:
    """Every route this server answers: the task's own first, then the shared surfaces."""
    return [*service.runtime.routes(), *openai.ROUTES, *v2.ROUTES, *ops.ROUTES]


def create_app(service: ModelService, config: ServeConfig) -> Starlette:
    specs = route_specs(service)
    metrics = service.metrics
    routes = [Route(s.path, endpoint(s, config, metrics), methods=[s.method]) for s in specs]

    async def http_error(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 500
        error: ServeError = (
            MethodNotAllowedError(f"{request.method} is not allowed on {request.url.path}")
            if code == 405
            else RouteNotFoundError(f"no route {request.url.path}")
            if code == 404
            else ServeError(f"HTTP {code}")
        )
        metrics.requests.labels(route="unmatched", status=str(status_of(error))).inc()
        return error_response(error)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        warm = asyncio.get_running_loop().create_task(service.start(config))  # the port opens meanwhile
        try:
            yield
        finally:
            warm.cancel()
            await service.stop()

    app = Starlette(routes=routes, exception_handlers={404: http_error, 405: http_error}, lifespan=lifespan)
    app.state.service = service
    app.state.config = config
    app.state.openapi = openapi_document(
        specs,
        {**v2.SCHEMAS, **service.runtime.schemas()},
        model_name=service.model_name,
        description=service.runtime.describe(),
    )
    return app
