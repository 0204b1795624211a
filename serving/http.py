"""What every route shares: reading bodies within limits, answering JSON, the route declaration
(`RouteSpec`: path, method, handler and its OpenAPI operation), and the wrapper that adds auth,
the error table and metrics around a handler. Handlers are module-level functions that find the
model service and the configuration on `request.app.state`."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from serving.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    PayloadTooLargeError,
    ServeError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    error_body,
    status_of,
)

if TYPE_CHECKING:
    from serving.config import ServeConfig
    from serving.metrics import Metrics
    from serving.service import ModelService

log = logging.getLogger("ortpack.serve")
Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"
_REJECTED = {429: "queue_full", 413: "too_large", 504: "deadline", 503: "not_ready", 401: "unauthorized"}


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status, headers, JSON)


def error_response(error: ServeError) -> Response:
    return json_response(error_body(error), status_of(error), error.headers)


def service_of(request: Request) -> ModelService:
    service: ModelService = request.app.state.service
    return service


def config_of(request: Request) -> ServeConfig:
    config: ServeConfig = request.app.state.config
    return config


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing bodies over `limit` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request body parsed as a JSON object (within --max-body-bytes)."""
    kind = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if kind not in (JSON, "") and not kind.endswith("+json"):
        raise UnsupportedMediaTypeError(f"send JSON with Content-Type application/json, not {kind!r}")
    body = await read_body(request, config_of(request).max_body_bytes)
    if not body:
        raise InvalidRequestError("empty request body; send a JSON object")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return parsed


def check_model(request: Request, name: str | None = None, version: str | None = None) -> None:
    """404 unless `name` (default: the `{name}` path parameter) is the served model."""
    service = service_of(request)
    name = name if name is not None else request.path_params["name"]
    version = version if version is not None else request.path_params.get("version")
    if name != service.model_name:
        raise ModelNotFoundError(f"model {name!r} not found (this server serves {service.model_name!r})")
    if version is not None and version != service.manifest.version:
        raise ModelNotFoundError(f"model {name!r} has no version {version!r} (it has {service.manifest.version!r})")


@dataclass(frozen=True, kw_only=True)
class RouteSpec:
    """One route: where, which handler, and what its OpenAPI operation says."""

    path: str
    method: str
    handler: Handler
    summary: str
    operation_id: str
    label: str = ""  # the `route` label in metrics (default: the path)
    guarded: bool = True  # needs the API key when one is set
    request_schema: str | None = None  # a components/schemas name, JSON body
    request_media: tuple[str, ...] = ()  # other request media types (raw image bytes)
    response_schema: str | None = None
    errors: tuple[int, ...] = ()
    parameters: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)  # more of the operation object

    @property
    def metric_label(self) -> str:
        return self.label or self.path

    def operation(self) -> dict[str, Any]:
        op: dict[str, Any] = {"summary": self.summary, "operationId": self.operation_id}
        if not self.guarded:
            op["security"] = []
        params = [*self.parameters]
        params += [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in ("name", "version")
            if "{" + p + "}" in self.path
        ]
        if params:
            op["parameters"] = params
        content: dict[str, Any] = {}
        if self.request_schema:
            content[JSON] = {"schema": {"$ref": f"#/components/schemas/{self.request_schema}"}}
        for media in self.request_media:
            content[media] = {"schema": {"type": "string", "format": "binary"}}
        if content:
            op["requestBody"] = {"required": True, "content": content}
        ok: dict[str, Any] = {"description": "OK"}
        if self.response_schema:
            ok["content"] = {JSON: {"schema": {"$ref": f"#/components/schemas/{self.response_schema}"}}}
        codes = sorted({*self.errors, *((401,) if self.guarded else ())})
        op["responses"] = {"200": ok, **{str(c): _error_answer(c) for c in codes}}
        op.update(self.extra)
        return op


_ERROR_TEXT = {
    400: "invalid request",
    401: "missing or wrong API key",
    404: "unknown model",
    413: "too large",
    415: "unsupported media type",
    429: "queue full (see Retry-After)",
    503: "not ready or shutting down",
    504: "deadline exceeded",
}


def _error_answer(code: int) -> dict[str, Any]:
    return {
        "description": _ERROR_TEXT.get(code, "error"),
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def endpoint(spec: RouteSpec, config: ServeConfig, metrics: Metrics) -> Handler:
    """Auth, the error table and metrics around one route's handler."""
    expected = f"Bearer {config.api_key}".encode() if config.api_key and spec.guarded else None
    label = spec.metric_label

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        metrics.in_flight.inc()
        try:
            if expected is not None:
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    raise UnauthorizedError("missing or wrong API key (send 'Authorization: Bearer <key>')")
            response = await spec.handler(request)
        except ServeError as exc:
            response = error_response(exc)
            reason = _REJECTED.get(response.status_code)
            if reason:
                metrics.rejections.labels(reason=reason).inc()
        except Exception as exc:
            log.exception("unexpected error on %s", label)
            response = error_response(ServeError(f"internal error: {type(exc).__name__}"))
        finally:
            metrics.in_flight.dec()
        metrics.requests.labels(route=label, status=str(response.status_code)).inc()
        metrics.latency.labels(route=label).observe(time.perf_counter() - started)
        return response

    return run
