"""The Open Inference Protocol v2 REST surface (KServe): server metadata, health, model metadata
and readiness, and inference, with its tensors' data as JSON or as raw bytes after the JSON (the
binary tensor data extension, serving/binary_tensors.py).

The tensors are the task's declaration (its contract's signature, kernel/contracts/tensors.py):
a request carries each declared input by name (the plugin turns them into its engine's payloads:
`v2_payloads`), and the answer holds every declared output, or those the request names. An output
with one row per item stacks the items' rows ([n, ...]); an output whose count varies per item (a
detector's boxes) holds every item's rows end to end, and an output marked as the item index
(a detection's image) numbers them by their item in the request."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from ortpack import __version__
from ortpack.kernel.contracts.tensors import Tensor
from ortpack.kernel.engine import Item
from ortpack.serving.binary_tensors import (
    EXTENSION,
    HEADER_LENGTH,
    attach_binary_inputs,
    encode_array,
    header_length,
    wants_binary,
)
from ortpack.serving.errors import InvalidRequestError, NotReadyError
from ortpack.serving.http import (
    RouteSpec,
    check_model,
    config_of,
    json_bytes,
    json_object,
    json_response,
    read_body,
    read_json_object,
    space_headers,
    stage,
)
from ortpack.serving.service import model_service
from ortpack.serving.tasks.contract import InferInput


async def server_metadata(request: Request) -> Response:
    return json_response({"name": "ortpack", "version": __version__, "extensions": [EXTENSION]})


async def live(request: Request) -> Response:
    return json_response({"live": True})


async def ready(request: Request) -> Response:
    """200 once warm-up is done; 503 again from SIGTERM on, while the server still serves its
    grace period (`draining`), so endpoints stop routing to it before it stops accepting."""
    service = model_service(request)
    if service.draining:
        raise NotReadyError("shutting down")
    if not service.ready:
        raise NotReadyError("warming up")
    return json_response({"ready": True})


async def model_ready(request: Request) -> Response:
    check_model(request)
    return await ready(request)


def model_metadata(request: Request) -> dict[str, Any]:
    service = model_service(request)
    manifest = service.manifest
    signature, sizes = manifest.signature, manifest.sizes
    space = service.space
    return {
        "name": service.model_name,
        "versions": [manifest.version],
        "platform": "onnxruntime_onnx",
        "inputs": [t.v2(sizes) for t in signature.served_inputs],
        "outputs": [t.v2(sizes) for t in signature.outputs],
        "parameters": {
            "variant": service.variant.id,
            "task": manifest.task,
            "node_check": service.node_check.as_dict() | {"variant": service.variant.id}
            if service.node_check
            else None,
            "rejected_variants": [r.as_dict() | {"variant": r.variant_id} for r in service.rejected],
            "embedding_space": space.model_dump() if space is not None else None,
            "policy": {"require": list(config_of(request).require), "excluded": service.excluded},
        },
    }


async def model_meta(request: Request) -> Response:
    check_model(request)
    return json_response(model_metadata(request))


def _inputs(body: dict[str, Any], declared: tuple[Tensor, ...]) -> dict[str, dict[str, Any]]:
    """The request's input tensors by name: each one the task declares, once, with its datatype;
    every declared input that is not optional present."""
    inputs = body.get("inputs")
    expected = ", ".join(f"{{'name': '{t.name}', 'datatype': '{t.datatype}', ...}}" for t in declared)
    if not isinstance(inputs, list) or not inputs or not all(isinstance(x, dict) for x in inputs):
        raise InvalidRequestError(f"inputs must be a list of tensors: {expected}")
    known = {t.name: t for t in declared}
    found: dict[str, dict[str, Any]] = {}
    for tensor in inputs:
        name = tensor.get("name")
        if name not in known:
            raise InvalidRequestError(f"unknown input {name!r}; this model takes {', '.join(repr(n) for n in known)}")
        if name in found:
            raise InvalidRequestError(f"input {name!r} is given twice")
        if tensor.get("datatype") != known[name].datatype:
            raise InvalidRequestError(
                f"input '{name}' must have datatype {known[name].datatype}, got {tensor.get('datatype')!r}"
            )
        found[name] = tensor
    missing = [t.name for t in declared if t.name not in found and not t.optional]
    if missing:
        raise InvalidRequestError(f"missing input {', '.join(repr(m) for m in missing)}: send {expected}")
    return found


def _outputs(body: dict[str, Any], declared: tuple[Tensor, ...]) -> list[Tensor]:
    """The outputs the answer holds: those `outputs` names ({"name": ...} objects), else all."""
    outputs = body.get("outputs")
    if outputs is None:
        return list(declared)
    if not isinstance(outputs, list):
        raise InvalidRequestError(f"outputs must be a list of {{'name': ...}} objects, got {outputs!r}")
    known = {t.name: t for t in declared}
    chosen: dict[str, Tensor] = {}
    for output in outputs:
        name = output.get("name") if isinstance(output, dict) else None
        if name not in known:
            names = ", ".join(repr(n) for n in known)
            raise InvalidRequestError(f"unknown output {output!r}; this model has {names}")
        chosen[name] = known[name]
    return list(chosen.values()) or list(declared)


def output_array(tensor: Tensor, items: list[Item]) -> np.ndarray:
    """One declared output over a request's items: their rows stacked (one row per item), or their
    own rows end to end (a varying count per item), item indices renumbered for this request."""
    if tensor.per_item:
        return np.stack([item[tensor.name] for item in items])
    if tensor.item_index:
        parts = [np.full(len(item[tensor.name]), i, dtype=tensor.dtype) for i, item in enumerate(items)]
    else:
        parts = [np.asarray(item[tensor.name], dtype=tensor.dtype) for item in items]
    width = tuple(d if isinstance(d, int) else 0 for d in tensor.shape[1:])
    return np.concatenate(parts) if parts else np.zeros((0, *width), dtype=tensor.dtype)


async def read_infer_request(request: Request) -> tuple[dict[str, Any], memoryview | None]:
    """(the request's JSON, the bytes after it). With `Inference-Header-Content-Length` the body
    is that many bytes of JSON, then the binary tensor data, whatever its Content-Type (Triton
    ignores it, and a browser cannot send that header cross-origin without a preflight);
    without it, the body is JSON alone (None)."""
    declared = request.headers.get(HEADER_LENGTH)
    if declared is None:
        return await read_json_object(request), None
    with stage("read"):
        body = memoryview(await read_body(request, config_of(request).max_body_bytes))
        length = header_length(declared, len(body))
        return json_object(body[:length]), body[length:]


async def infer(request: Request) -> Response:
    check_model(request)
    service = model_service(request)
    signature = service.manifest.signature
    body, binary = await read_infer_request(request)
    if "id" in body and not isinstance(body["id"], str):
        raise InvalidRequestError(f"id must be a string, got {body['id']!r}")
    tensors = _inputs(body, signature.served_inputs)
    attach_binary_inputs(body["inputs"], binary)
    wanted = _outputs(body, signature.outputs)
    binary_output = wants_binary(body)
    inputs = {name: InferInput.of(tensor) for name, tensor in tensors.items()}
    payloads, buckets = await service.runtime.v2_payloads(inputs)
    items = await service.infer(payloads, buckets)
    arrays = [(tensor, output_array(tensor, items)) for tensor in wanted]
    outputs: list[dict[str, Any]] = [
        {"name": tensor.name, "datatype": tensor.datatype, "shape": list(array.shape)} for tensor, array in arrays
    ]
    answer: dict[str, Any] = {
        "model_name": service.model_name,
        "model_version": service.manifest.version,
        "outputs": outputs,
    }
    if "id" in body:
        answer["id"] = body["id"]
    if not binary_output:
        for output, (_, array) in zip(outputs, arrays, strict=True):
            output["data"] = array.reshape(-1)
        return json_response(answer, headers=space_headers(request))
    with stage("serialize"):
        chunks = []
        for output, (tensor, array) in zip(outputs, arrays, strict=True):
            data = encode_array(array, tensor.datatype)
            output["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        header = json_bytes(answer)
        content = b"".join([header, *chunks])
    headers = (space_headers(request) or {}) | {HEADER_LENGTH: str(len(header))}
    return Response(content, 200, headers, "application/octet-stream")


_INFER_ERRORS = (400, 404, 413, 415, 429, 503, 504)


def _versions(spec: RouteSpec, suffix: str) -> RouteSpec:
    """The same route under /v2/models/{name}/versions/{version}/..., counted under one label."""
    return RouteSpec(
        path=f"/v2/models/{{name}}/versions/{{version}}{suffix}",
        method=spec.method,
        handler=spec.handler,
        summary=f"{spec.summary} (a given version)",
        operation_id=f"{spec.operation_id}Version",
        label=spec.path,
        request_schema=spec.request_schema,
        request_example=spec.request_example,
        response_schema=spec.response_schema,
        errors=spec.errors,
    )


_MODEL = RouteSpec(
    path="/v2/models/{name}",
    method="GET",
    handler=model_meta,
    summary="Model metadata, with the variant served and its check on this node",
    operation_id="modelMetadata",
    errors=(404,),
)
_MODEL_READY = RouteSpec(
    path="/v2/models/{name}/ready",
    method="GET",
    handler=model_ready,
    summary="Model readiness",
    operation_id="modelReady",
    errors=(404, 503),
)
_INFER = RouteSpec(
    path="/v2/models/{name}/infer",
    method="POST",
    handler=infer,
    summary="Infer (Open Inference Protocol v2): the task's named input tensors",
    operation_id="modelInfer",
    request_schema="InferRequest",
    # the binary tensor data extension: Inference-Header-Content-Length bytes of JSON, then tensor bytes
    request_media=("application/octet-stream",),
    response_schema="InferResponse",
    errors=_INFER_ERRORS,
)

ROUTES = [
    RouteSpec(
        path="/v2", method="GET", handler=server_metadata, summary="Server metadata", operation_id="serverMetadata"
    ),
    RouteSpec(
        path="/v2/health/live",
        method="GET",
        handler=live,
        summary="Liveness (no auth)",
        operation_id="live",
        guarded=False,
    ),
    RouteSpec(
        path="/v2/health/ready",
        method="GET",
        handler=ready,
        summary="Readiness: 200 once the node check and warm-up are done (no auth)",
        operation_id="ready",
        guarded=False,
        errors=(503,),
    ),
    _MODEL,
    _MODEL_READY,
    _INFER,
    _versions(_MODEL, ""),
    _versions(_MODEL_READY, "/ready"),
    _versions(_INFER, "/infer"),
]

# What an example tensor holds: texts for BYTES inputs (a query and a passage, so pairs work too).
_EXAMPLE_TEXTS = ["What is ONNX?", "ONNX is an open format for machine learning models."]


def infer_example(tensors: list[dict[str, Any]]) -> dict[str, Any]:
    """An inference request that works for the task's input tensors (their v2 metadata): one item,
    every other free dimension 2 (a 2x2 image), texts for BYTES and small integers otherwise."""
    inputs = []
    for tensor in tensors:
        shape = [1] + [2 if d < 0 else int(d) for d in tensor["shape"][1:]]
        count = int(np.prod(shape))
        data: list[Any] = (
            [_EXAMPLE_TEXTS[i % 2] for i in range(count)]
            if tensor["datatype"] == "BYTES"
            else [(i * 40) % 256 for i in range(count)]
        )
        inputs.append({"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"], "data": data})
    return {"inputs": inputs}


def routes_for(tensors: list[dict[str, Any]]) -> list[RouteSpec]:
    """`ROUTES`, the inference routes with an example request for these input tensors."""
    example = infer_example(tensors)
    return [dataclasses.replace(r, request_example=example) if r.request_schema else r for r in ROUTES]


SCHEMAS: dict[str, Any] = {
    "InferTensor": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer"}},
            "datatype": {"type": "string"},
            "data": {"type": "array", "description": "absent when parameters.binary_data_size is set"},
            "parameters": {
                "type": "object",
                "properties": {"binary_data_size": {"type": "integer", "minimum": 0}},
            },
        },
    },
    "InferRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/InferTensor"}},
            "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
            "outputs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}},
                    },
                },
            },
        },
    },
    "InferResponse": {
        "type": "object",
        "properties": {
            "model_name": {"type": "string"},
            "model_version": {"type": "string"},
            "id": {"type": "string"},
            "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/InferTensor"}},
        },
    },
}
