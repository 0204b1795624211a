"""Serving text embeddings: OpenAI `POST /v1/embeddings`, and the Open Inference Protocol with one
input `text` (BYTES, `[n]`) and one output `sentence_embedding` (FP32, `[n, dim]`).

Texts are tokenized with the bundle's tokenizer.json (serving/text.py) and queued by padded-length
bucket; the backend pads each batch to its longest text.
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from serving.backend import TextEmbeddingBackend
from serving.contracts.text_embedding import TextEmbeddingSettings
from serving.errors import InvalidRequestError, PayloadTooLargeError
from serving.gates import embedding_metrics
from serving.http import RouteSpec, check_model, json_response, read_json_object, service_of, space_headers
from serving.tasks.contract import LoadContext, ServingTask
from serving.text import Encoded, TextEncoder, TokenizedRuntime, parse_text_input, probe_prepare, v2_texts


class TextEmbeddingRuntime(TokenizedRuntime):
    """A loaded text-embedding variant: its tokenizer (with the server's limits) and backend."""

    output_name = "sentence_embedding"

    def __init__(self, ctx: LoadContext) -> None:
        manifest, config = ctx.manifest, ctx.config
        settings = manifest.task_settings
        if not isinstance(settings, TextEmbeddingSettings):
            raise ValueError(f"not a text-embedding bundle: {manifest.task}")
        tokenizer = settings.tokenizer
        self.max_items = config.max_items
        self.encoder = TextEncoder.for_server(ctx.files[tokenizer.file].decode(), tokenizer.max_length, config)
        self.output_dim = int(manifest.outputs[0].shape[-1])
        self.backend = _backend(ctx.session, manifest.model_dump())
        self.batching = f"buckets {self.encoder.buckets}"
        self._probe = probe_prepare(manifest.model_dump(), ctx.files)

    async def encode(self, texts: list[str] | None, ids: list[list[int]] | None, where: str) -> Encoded:
        count = len(texts or ids or [])
        if count > self.max_items:
            raise PayloadTooLargeError(f"{where} has {count} items; the limit is {self.max_items}")
        if texts is not None:
            return await self.encoder.encode_async(texts)
        return self.encoder.from_ids(ids or [])

    def v2_outputs(self) -> list[dict[str, Any]]:
        return [{"name": self.output_name, "datatype": "FP32", "shape": [-1, self.output_dim]}]

    def v2_inputs(self) -> list[dict[str, Any]]:
        return [{"name": "text", "datatype": "BYTES", "shape": [-1]}]

    async def v2_payloads(self, tensor: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        encoded = await self.encode(v2_texts(tensor), None, "inputs[0].data")
        return encoded.payloads, encoded.buckets

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec(
                path="/v1/embeddings",
                method="POST",
                handler=embeddings,
                summary="Embed texts (OpenAI-compatible)",
                operation_id="createEmbeddings",
                request_schema="EmbeddingsRequest",
                request_example={"input": ["The quick brown fox jumps over the lazy dog.", "A second sentence."]},
                response_schema="EmbeddingsResponse",
                errors=(400, 404, 413, 415, 429, 503, 504),
            )
        ]

    def schemas(self) -> dict[str, Any]:
        return SCHEMAS

    def describe(self) -> str:
        return "text embeddings: OpenAI /v1/embeddings and the Open Inference Protocol v2"


async def embeddings(request: Request) -> Response:
    service = service_of(request)
    runtime: TextEmbeddingRuntime = service.runtime  # type: ignore[assignment]
    body = await read_json_object(request)
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise InvalidRequestError("model must be a string")
        check_model(request, model, None)
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if not isinstance(encoding, str) or encoding not in ("float", "base64"):
        raise InvalidRequestError(f"encoding_format must be 'float' or 'base64', got {encoding!r}")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions != runtime.output_dim
    ):
        raise InvalidRequestError(f"dimensions must be {runtime.output_dim} for this model (got {dimensions!r})")
    if "input" not in body:
        raise InvalidRequestError("missing 'input'")
    texts, ids = parse_text_input(body["input"], "input")
    encoded = await runtime.encode(texts, ids, "input")
    rows = await service.infer(encoded.payloads, encoded.buckets, tokens=encoded.tokens)
    if encoding == "base64":
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()}
            for i, row in enumerate(rows)
        ]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    usage = {"prompt_tokens": encoded.tokens, "total_tokens": encoded.tokens}
    return json_response(
        {"object": "list", "data": data, "model": service.model_name, "usage": usage}, headers=space_headers(request)
    )


def _backend(session: Any, fields: dict[str, Any]) -> TextEmbeddingBackend:
    tokenizer = fields["task_settings"]["tokenizer"]
    dim = int(fields["outputs"][0]["shape"][-1])
    return TextEmbeddingBackend(session, tokenizer["model_input_names"], int(tokenizer["pad_token_id"]), dim)


SCHEMAS: dict[str, Any] = {
    "EmbeddingsRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": {
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}},
                    {"type": "array", "items": {"type": "integer"}},
                    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                ]
            },
            "model": {"type": "string"},
            "encoding_format": {"enum": ["float", "base64"], "default": "float"},
            "dimensions": {"type": "integer"},
            "user": {"type": "string"},
        },
    },
    "EmbeddingsResponse": {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "model": {"type": "string"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "object": {"const": "embedding"},
                        "index": {"type": "integer"},
                        "embedding": {
                            "oneOf": [
                                {"type": "array", "items": {"type": "number"}},
                                {"type": "string", "description": "base64 little-endian float32"},
                            ]
                        },
                    },
                },
            },
            "usage": {
                "type": "object",
                "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
            },
        },
    },
}

TASK = ServingTask(
    name="text-embedding",
    open=TextEmbeddingRuntime,
    probe_prepare=probe_prepare,
    backend=_backend,
    probe_metrics=lambda reference, candidate, _inputs: embedding_metrics(reference, candidate),
)
