"""Serving text embeddings: OpenAI `POST /v1/embeddings`, and the Open Inference Protocol with one
input `text` (BYTES, `[n]`) and one output `sentence_embedding` (FP32, `[n, dim]`).

Texts are tokenized with the bundle's tokenizer.json (the engine's, kernel/engines/tokens.py, with
the server's limits) and queued by padded-length bucket; the engine pads each batch to its
longest text. The request and answer bodies are the
pydantic models below: the same models parse requests and write the OpenAPI schemas.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.text_embedding import OUTPUT
from ortpack.kernel.tokenizer import Encoded
from ortpack.serving.bodies import component_schemas, read_body_as
from ortpack.serving.errors import InvalidRequestError, PayloadTooLargeError
from ortpack.serving.http import RouteSpec, check_model, json_response, service_of, space_headers
from ortpack.serving.tasks.contract import LoadContext, ServingTask
from ortpack.serving.text import TextsOrTokens, encode_ids, encode_texts, texts_or_ids, v2_texts


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request. `dimensions`, when sent, must be the model's own; `user` is
    accepted and ignored."""

    model_config = ConfigDict(strict=True)

    input: TextsOrTokens
    model: str | None = None
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = None
    user: str | None = None

    @field_validator("dimensions", mode="wrap")
    @classmethod
    def _the_models_own(cls, value: Any, handler: Any, info: ValidationInfo) -> Any:
        want = (info.context or {}).get("dimensions")
        try:
            fits = handler(value) in (None, want)
        except ValidationError:
            fits = False
        if not fits:
            raise InvalidRequestError(f"dimensions must be {want} for this model (got {value!r})")
        return value


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | Annotated[str, Field(description="base64 little-endian float32")]


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


# The handler writes this answer as a dict (orjson writes the numpy rows); tests check answers
# against the model.
class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class TextEmbeddingRuntime:
    """The HTTP side of a text-embedding variant: its engine's tokenizer with the server's limits."""

    def __init__(self, ctx: LoadContext) -> None:
        self.engine = ctx.engine
        self.encoder = self.engine.encoder  # type: ignore[attr-defined]  # a TokenEngine's
        self.max_items = ctx.config.max_items
        self.output_dim = ctx.manifest.sizes["dim"]

    async def encode(self, texts: list[str] | None, ids: list[list[int]] | None, where: str) -> Encoded:
        count = len(texts or ids or [])
        if count > self.max_items:
            raise PayloadTooLargeError(f"{where} has {count} items; the limit is {self.max_items}")
        if texts is not None:
            return await encode_texts(self.encoder, texts)
        return await encode_ids(self.encoder, ids or [])

    async def v2_payloads(self, tensors: dict[str, dict[str, Any]]) -> tuple[list[Any], list[Any]]:
        encoded = await self.encode(v2_texts(tensors["text"]), None, "inputs[0].data")
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
        return component_schemas([EmbeddingsRequest], [EmbeddingsResponse])

    def describe(self) -> str:
        return "text embeddings: OpenAI /v1/embeddings and the Open Inference Protocol v2"


async def embeddings(request: Request) -> Response:
    service = service_of(request)
    runtime: TextEmbeddingRuntime = service.runtime  # type: ignore[assignment]
    body = await read_body_as(request, EmbeddingsRequest, {"dimensions": runtime.output_dim})
    if body.model is not None:
        check_model(request, body.model, None)
    texts, ids = texts_or_ids(body.input)
    encoded = await runtime.encode(texts, ids, "input")
    items = await service.infer(encoded.payloads, encoded.buckets)
    rows = [item[OUTPUT] for item in items]
    if body.encoding_format == "base64":
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


TASK = ServingTask(name="text-embedding", open=TextEmbeddingRuntime)
