"""HTTP routes: OpenAI embeddings, the Open Inference Protocol v2 (KServe) REST surface,
Prometheus metrics and the OpenAPI document. Transport only: parsing, checking, shaping answers.
Scheduling is the batcher's job; running the model is the backend's."""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from serving import __version__
from serving.config import ServeConfig
from serving.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotReadyError,
    PayloadTooLargeError,
    RouteNotFoundError,
    ServeError,
    UnauthorizedError,
    UnsupportedMediaTypeError,
    error_body,
    status_of,
)
from serving.images import top_k
from serving.openapi import docs_html, openapi_document
from serving.service import ModelService
from serving.text import Encoded

log = logging.getLogger("ortpack.serve")
Handler = Callable[[Request], Awaitable[Response]]
_JSON = "application/json"
_REJECTED = {429: "queue_full", 413: "too_large", 504: "deadline", 503: "not_ready", 401: "unauthorized"}


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status, headers, _JSON)


def error_response(error: ServeError) -> Response:
    return json_response(error_body(error), status_of(error), error.headers)


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


async def read_json(request: Request, limit: int) -> Any:
    """The request body parsed as JSON (see `read_body` for the size limit)."""
    body = await read_body(request, limit)
    if not body:
        raise InvalidRequestError("empty request body; send a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"malformed JSON: {exc}") from None


def _texts_or_ids(value: Any, where: str) -> tuple[list[str] | None, list[list[int]] | None]:
    """OpenAI `input`: a string, a list of strings, a token-id array or a list of them."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InvalidRequestError(f"{where} must be a non-empty string, list of strings, or token-id arrays")
    if all(isinstance(v, str) for v in value):
        for i, text in enumerate(value):
            if not text.strip():
                raise InvalidRequestError(f"{where}[{i}] is empty")
        return value, None
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None, [value]
    if all(isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v) for v in value):
        return None, value
    raise InvalidRequestError(
        f"{where} must be a string, a list of strings, a token-id array or a list of non-empty token-id arrays"
    )


def create_app(service: ModelService, config: ServeConfig) -> Starlette:
    metrics = service.metrics
    expected_auth = f"Bearer {config.api_key}".encode() if config.api_key else None

    def endpoint(route: str, handler: Handler, *, guarded: bool = True) -> Handler:
        """Auth, the error table and metrics around one route's handler."""

        async def run(request: Request) -> Response:
            started = time.perf_counter()
            metrics.in_flight.inc()
            try:
                if guarded and expected_auth is not None:
                    given = request.headers.get("authorization", "").encode()
                    if not hmac.compare_digest(given, expected_auth):
                        raise UnauthorizedError("missing or wrong API key (send 'Authorization: Bearer <key>')")
                response = await handler(request)
            except ServeError as exc:
                response = error_response(exc)
                reason = _REJECTED.get(response.status_code)
                if reason:
                    metrics.rejections.labels(reason=reason).inc()
            except Exception as exc:
                log.exception("unexpected error on %s", route)
                response = error_response(ServeError(f"internal error: {type(exc).__name__}"))
            finally:
                metrics.in_flight.dec()
            metrics.requests.labels(route=route, status=str(response.status_code)).inc()
            metrics.latency.labels(route=route).observe(time.perf_counter() - started)
            return response

        return run

    def check_model(name: str, version: str | None = None) -> None:
        if name != service.model_name:
            raise ModelNotFoundError(f"model {name!r} not found (this server serves {service.model_name!r})")
        if version is not None and version != service.manifest.version:
            raise ModelNotFoundError(f"model {name!r} has no version {version!r} (it has {service.manifest.version!r})")

    async def encode(texts: list[str] | None, ids: list[list[int]] | None, where: str) -> Encoded:
        count = len(texts or ids or [])
        if count > config.max_items:
            raise PayloadTooLargeError(f"{where} has {count} items; the limit is {config.max_items}")
        encoder = service.encoder
        assert encoder is not None  # text routes exist only for text bundles
        if texts is not None:
            return await encoder.encode_async(texts)
        return encoder.from_ids(ids or [])

    # ------------------------------------------------------------------ OpenAI

    async def embeddings(request: Request) -> Response:
        body = await read_json(request, config.max_body_bytes)
        if not isinstance(body, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str):
                raise InvalidRequestError("model must be a string")
            check_model(model)
        encoding = body.get("encoding_format", "float") or "float"
        if encoding not in ("float", "base64"):
            raise InvalidRequestError(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != service.dim:
            raise InvalidRequestError(f"dimensions must be {service.dim} for this model (got {dimensions!r})")
        if "input" not in body:
            raise InvalidRequestError("missing 'input'")
        texts, ids = _texts_or_ids(body["input"], "input")
        encoded = await encode(texts, ids, "input")
        rows = await service.embed(encoded)
        if encoding == "base64":
            data = [
                {"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()}
                for i, row in enumerate(rows)
            ]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
        usage = {"prompt_tokens": encoded.tokens, "total_tokens": encoded.tokens}
        return json_response({"object": "list", "data": data, "model": service.model_name, "usage": usage})

    async def list_models(request: Request) -> Response:
        return json_response(
            {
                "object": "list",
                "data": [{"id": service.model_name, "object": "model", "created": 0, "owned_by": "ortpack"}],
            }
        )

    # ------------------------------------------------------------------ Open Inference Protocol v2

    images = service.task == "image-classification"
    labels = service.manifest.labels or []

    def model_metadata() -> dict[str, Any]:
        return {
            "name": service.model_name,
            "versions": [service.manifest.version],
            "platform": "onnxruntime_onnx",
            "inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}]
            if images
            else [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": service.manifest.outputs[0].name, "datatype": "FP32", "shape": [-1, service.dim]}],
            "parameters": {"variant": service.variant.id, "task": service.manifest.task},
        }

    async def server_metadata(request: Request) -> Response:
        return json_response({"name": "ortpack", "version": __version__, "extensions": []})

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        if not service.ready:
            raise NotReadyError("warming up" if not service.draining else "shutting down")
        return json_response({"ready": True})

    async def model_ready(request: Request) -> Response:
        check_model(request.path_params["name"], request.path_params.get("version"))
        return await ready(request)

    async def model_meta(request: Request) -> Response:
        check_model(request.path_params["name"], request.path_params.get("version"))
        return json_response(model_metadata())

    def single_input(body: dict[str, Any], name: str, datatype: str) -> dict[str, Any]:
        """The request's one input tensor, checked for its name and datatype."""
        inputs = body.get("inputs")
        if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
            raise InvalidRequestError(
                f"inputs must be a list holding one tensor: {{'name': '{name}', 'datatype': '{datatype}', ...}}"
            )
        tensor: dict[str, Any] = inputs[0]
        if tensor.get("name") != name:
            raise InvalidRequestError(f"unknown input {tensor.get('name')!r}; this model takes '{name}'")
        if tensor.get("datatype") != datatype:
            raise InvalidRequestError(f"input '{name}' must have datatype {datatype}, got {tensor.get('datatype')!r}")
        return tensor

    def check_outputs(body: dict[str, Any]) -> None:
        for output in body.get("outputs") or []:
            if not isinstance(output, dict) or output.get("name") != service.manifest.outputs[0].name:
                raise InvalidRequestError(
                    f"unknown output {output!r}; this model has {service.manifest.outputs[0].name!r}"
                )

    def tensor_answer(body: dict[str, Any], rows: np.ndarray) -> Response:
        answer: dict[str, Any] = {
            "model_name": service.model_name,
            "model_version": service.manifest.version,
            "outputs": [
                {
                    "name": service.manifest.outputs[0].name,
                    "datatype": "FP32",
                    "shape": list(rows.shape),
                    "data": rows.reshape(-1),
                }
            ],
        }
        if "id" in body:
            answer["id"] = body["id"]
        return json_response(answer)

    async def infer(request: Request) -> Response:
        check_model(request.path_params["name"], request.path_params.get("version"))
        body = await read_json(request, config.max_body_bytes)
        if not isinstance(body, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        if images:
            return await infer_images(body)
        tensor = single_input(body, "text", "BYTES")
        shape, data = tensor.get("shape"), tensor.get("data")
        if (
            not isinstance(shape, list)
            or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not 1 <= len(shape) <= 2
        ):
            raise InvalidRequestError(f"input 'text' shape must be [n] or [n, 1], got {shape!r}")
        if len(shape) == 2 and shape[1] != 1:
            raise InvalidRequestError(f"input 'text' shape must be [n] or [n, 1], got {shape!r}")
        if isinstance(data, list) and data and all(isinstance(d, list) for d in data):
            data = [x for row in data for x in row]  # row-major nested form
        if not isinstance(data, list) or len(data) != shape[0]:
            raise InvalidRequestError(
                f"input 'text' has shape {shape} but {len(data) if isinstance(data, list) else 'no'} elements"
            )
        check_outputs(body)
        texts, _ = _texts_or_ids(data, "inputs[0].data") if data else (None, None)
        if texts is None:
            raise InvalidRequestError("input 'text' must hold one or more non-empty strings")
        rows = await service.embed(await encode(texts, None, "inputs[0].data"))
        return tensor_answer(body, rows)

    async def infer_images(body: dict[str, Any]) -> Response:
        """v2 for image bundles: one UINT8 tensor 'images' [n, height, width, 3], row-major data."""
        tensor = single_input(body, "images", "UINT8")
        shape = tensor.get("shape")
        if (
            not isinstance(shape, list)
            or len(shape) != 4
            or shape[3] != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        ):
            raise InvalidRequestError(f"input 'images' shape must be [n, height, width, 3], got {shape!r}")
        n, height, width, _ = shape
        if n > config.max_items:
            raise PayloadTooLargeError(f"input 'images' has {n} images; the limit is {config.max_items}")
        if height * width > config.max_image_pixels:
            raise PayloadTooLargeError(f"images of {width}x{height} exceed the {config.max_image_pixels}-pixel limit")
        check_outputs(body)
        try:
            array = np.asarray(tensor.get("data"), dtype=np.int64)
        except (TypeError, ValueError):
            raise InvalidRequestError("input 'images' data must be integers 0..255") from None
        if array.size != n * height * width * 3:
            raise InvalidRequestError(f"input 'images' has shape {shape} but {array.size} elements")
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InvalidRequestError("input 'images' data must be integers 0..255")
        pixels = array.astype(np.uint8).reshape(n, height, width, 3)
        rows = await service.infer(list(pixels), [(height, width)] * n)
        return tensor_answer(body, rows)

    # ------------------------------------------------------------------ images

    def requested_top_k(value: object) -> int:
        if value is None:
            return 5
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= len(labels or [0] * service.dim):
            raise InvalidRequestError(f"top_k must be an integer in 1..{service.dim}, got {value!r}")
        return value

    async def classify_pixels(pixels: list[np.ndarray], k: int) -> list[list[dict[str, object]]]:
        rows = await service.infer(pixels, [p.shape[:2] for p in pixels])
        return [top_k(row, labels, k) for row in rows]

    async def classify(request: Request) -> Response:
        """The image itself as the body (Content-Type: image/jpeg, image/png or image/webp)."""
        kind = request.headers.get("content-type", "")
        if not kind.startswith("image/"):
            raise UnsupportedMediaTypeError(
                f"send the image bytes with Content-Type image/*, not {kind!r} (or base64 JSON to /v1/classify/json)"
            )
        k = requested_top_k(request.query_params.get("top_k"))
        data = await read_body(request, config.max_body_bytes)
        assert service.decoder is not None
        pixels = await asyncio.to_thread(service.decoder.decode, data, "the request body")
        (predictions,) = await classify_pixels([pixels], k)
        return json_response({"model": service.model_name, "predictions": predictions})

    async def classify_json(request: Request) -> Response:
        """{"image": base64} or {"images": [base64, ...]}, optional "top_k"."""
        body = await read_json(request, config.max_body_bytes)
        if not isinstance(body, dict) or ("image" in body) == ("images" in body):
            raise InvalidRequestError("send a JSON object with 'image' (base64) or 'images' (a list of base64)")
        k = requested_top_k(body.get("top_k"))
        single = "image" in body
        items = [body["image"]] if single else body["images"]
        if not isinstance(items, list) or not items:
            raise InvalidRequestError("'images' must be a non-empty list of base64 strings")
        if len(items) > config.max_items:
            raise PayloadTooLargeError(f"'images' has {len(items)} images; the limit is {config.max_items}")
        decoder = service.decoder
        assert decoder is not None
        where = ["image"] if single else [f"images[{i}]" for i in range(len(items))]
        pixels = await asyncio.to_thread(
            lambda: [decoder.decode_base64(x, w) for x, w in zip(items, where, strict=True)]
        )
        results = await classify_pixels(pixels, k)
        if single:
            return json_response({"model": service.model_name, "predictions": results[0]})
        return json_response(
            {"model": service.model_name, "data": [{"index": i, "predictions": p} for i, p in enumerate(results)]}
        )

    # ------------------------------------------------------------------ operations

    async def prometheus(request: Request) -> Response:
        metrics.queue_depth.set(service.batcher.depth)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def openapi(request: Request) -> Response:
        return json_response(openapi_document(service.model_name))

    async def docs(request: Request) -> Response:
        return HTMLResponse(docs_html(openapi_document(service.model_name)))

    task_routes = (
        [
            Route("/v1/classify", endpoint("/v1/classify", classify), methods=["POST"]),
            Route("/v1/classify/json", endpoint("/v1/classify/json", classify_json), methods=["POST"]),
        ]
        if images
        else [
            Route("/v1/embeddings", endpoint("/v1/embeddings", embeddings), methods=["POST"]),
        ]
    )
    routes = [
        *task_routes,
        Route("/v1/models", endpoint("/v1/models", list_models), methods=["GET"]),
        Route("/v2", endpoint("/v2", server_metadata), methods=["GET"]),
        Route("/v2/health/live", endpoint("/v2/health/live", live, guarded=False), methods=["GET"]),
        Route("/v2/health/ready", endpoint("/v2/health/ready", ready, guarded=False), methods=["GET"]),
        Route("/v2/models/{name}", endpoint("/v2/models/{name}", model_meta), methods=["GET"]),
        Route("/v2/models/{name}/ready", endpoint("/v2/models/{name}/ready", model_ready), methods=["GET"]),
        Route("/v2/models/{name}/infer", endpoint("/v2/models/{name}/infer", infer), methods=["POST"]),
        Route("/v2/models/{name}/versions/{version}", endpoint("/v2/models/{name}", model_meta), methods=["GET"]),
        Route(
            "/v2/models/{name}/versions/{version}/ready",
            endpoint("/v2/models/{name}/ready", model_ready),
            methods=["GET"],
        ),
        Route(
            "/v2/models/{name}/versions/{version}/infer", endpoint("/v2/models/{name}/infer", infer), methods=["POST"]
        ),
        Route("/metrics", endpoint("/metrics", prometheus), methods=["GET"]),
        Route("/openapi.json", endpoint("/openapi.json", openapi), methods=["GET"]),
        Route("/docs", endpoint("/docs", docs), methods=["GET"]),
    ]

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

    return Starlette(routes=routes, exception_handlers={404: http_error, 405: http_error})
