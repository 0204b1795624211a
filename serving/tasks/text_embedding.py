"""Serving text embeddings: OpenAI `POST /v1/embeddings`, and the Open Inference Protocol with one
input `text` (BYTES, `[n]`) and one output `sentence_embedding` (FP32, `[n, dim]`).

Texts are tokenized with the bundle's tokenizer.json (the engine's, kernel/engines/tokens.py, with
the server's limits) and queued by padded-length bucket; the engine pads each batch to its
longest text. The request and answer bodies are the
pydantic models below: the same models parse requests and write the OpenAPI schemas.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.base import TEXT
from ortpack.kernel.contracts.text_embedding import OUTPUT
from ortpack.kernel.engines.tokens import TokenEngine
from ortpack.kernel.tokenizer import Encoded
from ortpack.serving.bodies import component_schemas, read_request_for_model
from ortpack.serving.embeddings import EmbeddingsOptions, EmbeddingsResponse, embeddings_answer
from ortpack.serving.errors import PayloadTooLargeError
from ortpack.serving.http import RouteSpec, json_response, service_of, space_headers
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as
from ortpack.serving.text import TextsOrTokens, encode_ids, encode_texts, texts_or_ids, v2_texts


class EmbeddingsRequest(EmbeddingsOptions):
    """OpenAI's embeddings request with texts (or token ids) as `input`. `dimensions`, when sent, must be the
    model's own; `user` is accepted and ignored."""

    input: TextsOrTokens


class TextEmbeddingRuntime:
    """The HTTP side of a text-embedding variant: its engine's tokenizer with the server's limits."""

    def __init__(self, ctx: LoadContext) -> None:
        self.encoder = engine_as(ctx, TokenEngine).encoder
        self.max_items = ctx.config.max_items
        self.output_dim = ctx.manifest.sizes["dim"]

    async def encode(self, texts: list[str] | None, ids: list[list[int]] | None, where: str) -> Encoded:
        count = len(texts or ids or [])
        if count > self.max_items:
            raise PayloadTooLargeError(f"{where} has {count} items; the limit is {self.max_items}")
        if texts is not None:
            return await encode_texts(self.encoder, texts)
        return await encode_ids(self.encoder, ids or [])

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        encoded = await self.encode(v2_texts(inputs[TEXT.name]), None, "inputs[0].data")
        return encoded.payloads, encoded.buckets

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec(
                path="/v1/embeddings",
                method="POST",
                handler=self.embeddings,
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

    async def embeddings(self, request: Request) -> Response:
        service = service_of(request)
        body = await read_request_for_model(request, EmbeddingsRequest, {"dimensions": self.output_dim})
        texts, ids = texts_or_ids(body.input)
        encoded = await self.encode(texts, ids, "input")
        items = await service.infer(encoded.payloads, encoded.buckets)
        rows = [item[OUTPUT] for item in items]
        answer = embeddings_answer(rows, body.encoding_format, service.model_name, encoded.tokens)
        return json_response(answer, headers=space_headers(request))


TASK = ServingTask(name="text-embedding", open=TextEmbeddingRuntime)
