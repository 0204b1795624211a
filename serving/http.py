"""What every route shares: reading bodies within limits, answering JSON, the route declaration
(`RouteSpec`: path, method, handler and its OpenAPI operation), and the wrapper that adds auth,
the error table, the request context (id, deadline from arrival, timings), response headers,
the access log and metrics around a handler. Handlers are module-level functions that find the
model service and the configuration on `request.app.state`."""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import mmap
import os
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ortpack.kernel.errors import InputError
from ortpack.serving import context
from ortpack.serving.context import RequestContext, bind, unbind
from ortpack.serving.errors import (
    ClientClosedError,
    InvalidRequestError,
    ModelNotFoundError,
    NotReadyError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServeError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    error_body,
    from_input_error,
    status_of,
)
from ortpack.serving.stages import breakdown

# the scope key of a request's body reader, set by the connection (serving/protocol.py `read_body_into`)
BODY_INTO = "ortpack.read_body_into"
MAPPED_BODY_BYTES = 1 << 20  # bodies from this size are read into a mapping of their own (read_body)
# A lifted member (`lifted_member`): what its value reads as in the parsed object, where the scope
# keeps its bytes, and the body size from which it is tried.
LIFTED = "\x00lifted"
LIFTED_SCOPE = "ortpack.lifted"
LIFT_FROM_BYTES = 1 << 16
_FIRST_MEMBER = re.compile(rb'\{[ \t\n\r]*"([A-Za-z_]+)"[ \t\n\r]*:[ \t\n\r]*"')

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ortpack.kernel.bundle import EmbeddingSpace, Manifest
    from ortpack.kernel.engine import Item
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics

log = logging.getLogger("ortpack.serve")
access_log = logging.getLogger("ortpack.access")
Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"
_REJECTED = {
    429: "queue_full",
    413: "too_large",
    504: "deadline",
    503: "not_ready",
    401: "unauthorized",
    408: "slow_client",
    499: "client_gone",
}
# A client's x-request-id is echoed when it is short and plain; otherwise one is generated.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=-]{1,128}$")
# Request ids: 128 random bits from a generator seeded by the system's randomness (again in a
# forked child). uuid4 reads os.urandom per id, a system call that releases the GIL: on the event
# loop under load, a wait behind the decode and model threads per request (ids need no secrecy).
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)
CHALLENGE = 'Bearer realm="ortpack"'


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Adds the time what it wraps takes to the request's `read` or `serialize` stage."""
    started = time.perf_counter()
    yield
    ctx = context.current()
    if ctx is not None:
        attr = f"{name}_s"
        setattr(ctx, attr, getattr(ctx, attr) + time.perf_counter() - started)


def json_bytes(content: Any) -> bytes:
    """orjson writes numpy arrays natively (no Python float per value)."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """The time encoding takes is the request's `serialize` stage."""
    with stage("serialize"):
        body = json_bytes(content)
    return Response(body, status, headers, JSON)


def error_response(error: ServeError) -> Response:
    return json_response(error_body(error), status_of(error), error.headers)


class Served(Protocol):
    """What the routes read of the model service (ortpack.serving.service.ModelService, which the app
    puts in `app.state.service`): declared here so that this module, which the task plugins
    import, does not import the service, which imports the task plugins."""

    manifest: Manifest
    runtime: Any  # the task's runtime (ortpack.serving.tasks.TaskRuntime); routes narrow it to their own

    @property
    def model_name(self) -> str: ...

    @property
    def space(self) -> EmbeddingSpace | None: ...

    async def infer(
        self, payloads: Sequence[Any], buckets: Sequence[Any], shape: Callable[[Item], Any] | None = None
    ) -> list[Any]: ...

    def admit_body(self, size: int, form: str = "json") -> float: ...

    def hold(self, size: int, what: str, *, wait_s: float = 0.0, passing: bool = False) -> None: ...

    def hold_pixels(self, nbytes: int) -> None: ...

    def finished(self, ctx: RequestContext) -> None: ...


def service_of(request: Request) -> Served:
    service: Served = request.app.state.service
    return service


SPACE_HEADER = "X-Embedding-Space"  # on every answer that carries embeddings: the space they live in


def space_headers(request: Request) -> dict[str, str] | None:
    """`X-Embedding-Space: <id>` when the served variant has an embedding space, else none."""
    space = service_of(request).space
    return {SPACE_HEADER: space.id} if space is not None else None


def config_of(request: Request) -> ServeConfig:
    config: ServeConfig = request.app.state.config
    return config


def body_form(request: Request) -> str:
    """What the body is, for what it will hold (ortpack.serving.memory.body_expansion): "raw" (a
    file), "v2-binary" (a v2 JSON header, then binary tensor data), "v2-json" or "json"."""
    if request.headers.get("content-type", "").startswith("image/"):
        return "raw"
    if request.scope["path"].startswith("/v2/"):  # not request.url: that parses a URL object (~15 us)
        return "v2-binary" if "inference-header-content-length" in request.headers else "v2-json"
    return "json"


async def read_body(request: Request, limit: int) -> bytearray | memoryview:
    """The request body, refusing bodies over `limit` bytes without reading them all. Before
    reading, the service admits it (ModelService.admit_body: a request that could not finish in
    time, or whose body the memory budget cannot hold, is refused with 429 unread); a body
    without a Content-Length is admitted again as it arrives."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    service = service_of(request)
    known = int(declared) if declared is not None and declared.isdigit() else 0
    expansion = service.admit_body(known, body_form(request))
    # read into one buffer of the declared size: a list of chunks joined at the end held the body
    # twice. A large body gets a mapping of its own, returned to the system when it is dropped:
    # from the heap, glibc kept what an image flood's bodies had used (~500 MB after 100 x 2.6 MB)
    body: bytearray | mmap.mmap = mmap.mmap(-1, known) if known >= MAPPED_BODY_BYTES else bytearray(known)
    size = 0
    into = request.scope.get(BODY_INTO)
    if into is not None and known and "transfer-encoding" not in request.headers:
        try:  # the connection writes the body straight into `body` as it arrives (serving/protocol.py)
            size = await into(body)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    else:
        async for chunk in request.stream():
            end = size + len(chunk)
            if end > limit:
                raise PayloadTooLargeError(f"request body exceeds the {limit}-byte limit")
            if end > known:  # chunked (or more than declared): held as it arrives
                service.hold(int((end - known) * expansion), "its body")
                known = end
            if end > len(body):
                body = body if isinstance(body, bytearray) else bytearray(body[:size])
                body.extend(bytes(end - len(body)))
            body[size:end] = chunk
            size = end
    ctx = context.current()
    if ctx is not None:
        ctx.body_bytes = size
    # a body shorter than declared (the server's HTTP layer refuses that first) is cut to its size
    return memoryview(body)[:size] if size < len(body) or isinstance(body, mmap.mmap) else body


async def read_json_object(request: Request, lift: str | None = None) -> dict[str, Any]:
    """The request body parsed as a JSON object (within --max-body-bytes). A non-JSON Content-Type
    is 415: a browser may send text/plain cross-origin without a preflight, and `curl -d` sends
    application/x-www-form-urlencoded (add -H 'Content-Type: application/json'). No Content-Type
    at all is read as JSON. With `lift`, a body whose first member is `lift` with a long plain
    string value is parsed without it (`lifted_member`): the member reads as `LIFTED` and the
    scope's `LIFTED_SCOPE` holds the string's bytes (`lifted_value` finds them)."""
    kind = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if kind not in (JSON, "") and not kind.endswith("+json"):
        raise UnsupportedMediaTypeError(f"send JSON with Content-Type application/json, not {kind!r}")
    with stage("read"):
        body = await read_body(request, config_of(request).max_body_bytes)
        if lift is not None and (lifted := lifted_member(body, lift)) is not None:
            parsed, request.scope[LIFTED_SCOPE] = lifted
            return parsed
        return json_object(body)


def json_object(body: bytes | bytearray | memoryview) -> dict[str, Any]:
    """`body` parsed as a JSON object; anything else is 400."""
    if not body:
        raise InvalidRequestError("empty request body; send a JSON object")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return parsed


def lifted_member(body: bytes | bytearray | memoryview, key: str) -> tuple[dict[str, Any], memoryview] | None:
    """`body` parsed with its first member `key`'s string value left in place, when the body is
    `{"key": "...", ...}` of at least LIFT_FROM_BYTES with no backslash anywhere from the string
    on: (the object with `key` as LIFTED, a view of the string's bytes). None otherwise, and when
    anything after the string is not what `json_object` accepts or names `key` again: the full
    parse then answers as it always does. A base64 image is such a string: orjson makes a str of
    its 500 KB (0.14 ms on the event loop, and the str's memory) where its bytes are all the
    decoder needs. A string without an escape is its bytes as they stand; bytes that are not
    base64 are refused by the decoder."""
    if len(body) < LIFT_FROM_BYTES:
        return None
    # a view from read_body starts at its buffer's start: search the buffer (bytearray or mmap)
    raw: Any = body.obj if isinstance(body, memoryview) else body
    size = len(body)
    head = _FIRST_MEMBER.match(raw, 0, size)
    if head is None or head.group(1) != key.encode():
        return None
    start = head.end()
    end = raw.find(b'"', start, size)
    # no escape in the string (it is then its bytes) nor after it (no key there can spell `key`
    # but as it stands), and `key` not again: the object's `key` is this string
    if end < 0 or raw.find(b"\\", start, size) >= 0 or raw.find(b'"' + head.group(1) + b'"', end + 1, size) >= 0:
        return None
    try:
        parsed = orjson.loads(b"{" + raw[head.start(1) - 1 : head.end(1) + 1] + b':""' + raw[end + 1 : size])
    except orjson.JSONDecodeError:
        return None
    parsed[key] = LIFTED
    return parsed, memoryview(raw)[start:end]


def lifted_value(request: Request, value: Any) -> Any:
    """`value`, or the bytes of the member `read_json_object` lifted when `value` stands for it."""
    if value == LIFTED:
        return request.scope.get(LIFTED_SCOPE, value)
    return value


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
    request_example: dict[str, Any] | None = None  # a JSON body that works (/docs and OpenAPI show it)
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
            if self.request_example is not None:
                content[JSON]["example"] = self.request_example
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
    401: "missing or wrong API key (WWW-Authenticate: Bearer)",
    404: "unknown model",
    408: "request headers or body not received in time",
    413: "too large",
    415: "unsupported media type",
    429: "queue full (see Retry-After)",
    431: "request headers too large",
    503: "not ready or shutting down",
    504: "deadline exceeded",
}


def _error_answer(code: int) -> dict[str, Any]:
    return {
        "description": _ERROR_TEXT.get(code, "error"),
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


TIMEOUT_HEADER = "x-request-timeout"  # the client's own deadline, in seconds from sending


def client_timeout(request: Request, server_s: float) -> float:
    """The request's budget in seconds: the server's (--request-timeout-ms), or the client's
    `X-Request-Timeout` when that is shorter (400 unless a positive number of seconds)."""
    given = request.headers.get(TIMEOUT_HEADER)
    if given is None:
        return server_s
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise InvalidRequestError(f"X-Request-Timeout must be a positive number of seconds, got {given!r}")
    return min(seconds, server_s)


def request_id_of(request: Request) -> str:
    given = request.headers.get("x-request-id")
    return given if given is not None and _REQUEST_ID.match(given) else f"{_ids.getrandbits(128):032x}"


def authorized(request: Request, key: bytes) -> bool:
    """`Authorization: Bearer <key>`, the scheme in any case (RFC 7235), compared in constant time."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


def unauthorized(request: Request) -> UnauthorizedError:
    given = "authorization" in request.headers
    challenge = CHALLENGE + (', error="invalid_token"' if given else "")
    return UnauthorizedError(
        "wrong API key" if given else "missing API key (send 'Authorization: Bearer <key>')",
        headers={"WWW-Authenticate": challenge},
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def endpoint(spec: RouteSpec, config: ServeConfig, metrics: Metrics) -> Handler:
    """Auth, the request context, the error table, headers, the access log and metrics around one
    route's handler."""
    key = config.api_key.encode() if config.api_key and spec.guarded else None
    label = spec.metric_label
    timeout_s = config.request_timeout_ms / 1000.0
    logging_access = config.access_log
    # this route's series, made on first use (a route never asked does not show in the exposition)
    stages: dict[str, Any] = {}  # of the stage histogram
    answered: dict[int, Any] = {}  # of the requests counter, by status

    async def run(request: Request) -> Response:
        started = time.perf_counter()
        arrival = request.scope.get("ortpack.arrival", started)
        ctx = RequestContext(request_id=request_id_of(request), arrival=arrival, deadline=arrival + timeout_s)
        token = bind(ctx)
        metrics.in_flight.inc()
        try:
            if key is not None and not authorized(request, key):
                raise unauthorized(request)
            ctx.deadline = arrival + client_timeout(request, timeout_s)
            response = await spec.handler(request)
        except ServeError as exc:
            response = error_response(exc)
        except InputError as exc:  # the engine refused the input (kernel/errors.py)
            response = error_response(from_input_error(exc))
        except ClientDisconnect:
            response = _gone(request)
        except asyncio.CancelledError:
            # The connection layer cancels a request whose client went away; uvicorn cancels what is
            # still running when its drain timeout ends. Either way: one answer, no traceback.
            if request.scope.get("ortpack.disconnected"):
                response = error_response(ClientClosedError("the client went away"))
            else:
                response = error_response(NotReadyError("the server is shutting down"))
        except Exception as exc:
            log.exception("unexpected error on %s", label)
            response = error_response(ServeError(f"internal error: {type(exc).__name__}"))
        finally:
            metrics.in_flight.dec()
            unbind(token)
            if getattr(request.app.state, "service", None) is not None:
                service_of(request).finished(ctx)
        status = response.status_code
        reason = _REJECTED.get(status)
        if reason:
            metrics.rejections.labels(reason=reason).inc()
        headers = response.headers
        headers["x-request-id"] = ctx.request_id
        if ctx.queue_s is not None and ctx.inference_s is not None:
            headers["x-queue-time"] = _ms(ctx.queue_s)
            headers["x-inference-time"] = _ms(ctx.inference_s)
        ended = time.perf_counter()
        counter = answered.get(status)
        if counter is None:
            counter = answered[status] = metrics.requests.labels(route=label, status=str(status))
        counter.inc()
        metrics.latency.labels(route=label).observe(ended - started)  # a LoopHistogram: a dict lookup
        if status == 200 and (parts := breakdown(ctx, ended - arrival)) is not None:
            if not stages:
                stages.update(metrics.stage_observers(label))
            for stage, seconds in parts.items():
                stages[stage].observe(seconds)
        if logging_access:
            log_access(request, label, status, ctx, ended - arrival)
        return response

    return run


def _gone(request: Request) -> Response:
    """The body read stopped: the client went away (499), or the connection layer closed a slow
    body (it already answered 408)."""
    if request.scope.get("ortpack.timed_out"):
        return error_response(RequestTimeoutError("request body not received in time"))
    return error_response(ClientClosedError("the client went away while sending its body"))


def log_access(request: Request, route: str, status: int, ctx: RequestContext, seconds: float) -> None:
    """One access-log line (fields in `extra` too, for --log-format json)."""
    fields = {
        "method": request.method,
        "route": route,
        "status": status,
        "items": ctx.items,
        "tokens": ctx.tokens,
        "queue_ms": round(ctx.queue_s * 1000, 3) if ctx.queue_s is not None else None,
        "inference_ms": round(ctx.inference_s * 1000, 3) if ctx.inference_s is not None else None,
        "total_ms": round(seconds * 1000, 3),
        "request_id": ctx.request_id,
    }
    access_log.info(" ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items()), extra={"fields": fields})
