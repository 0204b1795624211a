"""OpenAI-compatible routes every bundle has (embeddings belong to the text-embedding task)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ortpack.serving.http import RouteSpec, json_response, service_of


async def list_models(request: Request) -> Response:
    name = service_of(request).model_name
    return json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "ortpack"}]}
    )


ROUTES = [
    RouteSpec(
        path="/v1/models",
        method="GET",
        handler=list_models,
        summary="List models (OpenAI-compatible)",
        operation_id="listModels",
    )
]
