"""Serving image embeddings: OpenAI `POST /v1/embeddings` with images in `input` (base64 or
`data:` URLs, as Infinity takes them), `POST /v1/embeddings/image` (one image as its bytes), and
the Open Inference Protocol with one input `images` (UINT8, `[n, height, width, 3]`) and one output
`image_embedding` (FP32, `[n, dim]`).

Images are decoded off the event loop by the engine's decoder (serving/images.py); images of one
size share a batch. Every answer carries `X-Embedding-Space`. `usage` counts no tokens (images have
none): its fields are 0, as OpenAI's schema requires them.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.image_embedding import OUTPUT, ImageEmbeddingSettings
from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.engines.images import ImageEngine
from ortpack.serving.bodies import component_schemas, read_request_for_model, worded
from ortpack.serving.embeddings import EmbeddingsOptions, EmbeddingsResponse, embeddings_answer
from ortpack.serving.errors import InvalidRequestError
from ortpack.serving.http import RouteSpec, json_response, service_of, space_headers
from ortpack.serving.images import EXAMPLE_PNG, MEDIA, ImageInputs, image_buckets
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as

Image = Annotated[str, Field(description="an image as base64 or a data: URL (JPEG, PNG or WebP)")]


class ImageEmbeddingsRequest(EmbeddingsOptions):
    """OpenAI's embeddings request with images as `input`. `dimensions`, when sent, must be the
    model's own; `user` is accepted and ignored."""

    input: Annotated[
        Image | Annotated[list[Image], Field(min_length=1)],
        worded("must be an image (base64 or a data: URL) or a non-empty list of them"),
    ]


class ImageEmbeddingRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        settings = ctx.manifest.task_settings
        if not isinstance(settings, ImageEmbeddingSettings):
            raise ValueError(f"not an image-embedding bundle: {ctx.manifest.task}")
        config = ctx.config
        self.images = ImageInputs(
            engine_as(ctx, ImageEngine).decoder,
            workers=config.worker_count,
            max_items=config.max_items,
            max_image_pixels=config.max_image_pixels,
        )
        self.output_dim = ctx.manifest.sizes["dim"]

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        pixels = self.images.from_v2(inputs[IMAGES.name])
        return pixels, image_buckets(pixels)

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec(
                path="/v1/embeddings",
                method="POST",
                handler=self.embeddings,
                summary="Embed images sent as base64 or data: URLs (OpenAI-compatible)",
                operation_id="createImageEmbeddings",
                request_schema="ImageEmbeddingsRequest",
                request_example={"input": [EXAMPLE_PNG]},
                response_schema="EmbeddingsResponse",
                errors=(400, 404, 413, 415, 429, 503, 504),
            ),
            RouteSpec(
                path="/v1/embeddings/image",
                method="POST",
                handler=self.embed_image,
                summary="Embed one image sent as its bytes (Content-Type image/jpeg, png or webp)",
                operation_id="createImageEmbedding",
                request_media=MEDIA,
                response_schema="EmbeddingsResponse",
                errors=(400, 413, 415, 429, 503, 504),
                parameters=(
                    {
                        "name": "encoding_format",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["float", "base64"], "default": "float"},
                    },
                ),
            ),
        ]

    def schemas(self) -> dict[str, Any]:
        return component_schemas([ImageEmbeddingsRequest], [EmbeddingsResponse])

    def describe(self) -> str:
        return "image embeddings: OpenAI /v1/embeddings with images and the Open Inference Protocol v2"

    async def embeddings(self, request: Request) -> Response:
        body = await read_request_for_model(
            request, ImageEmbeddingsRequest, {"dimensions": self.output_dim}, lift="input"
        )
        single = isinstance(body.input, str)
        items = [body.input] if isinstance(body.input, str) else body.input
        where = ["input"] if single else [f"input[{i}]" for i in range(len(items))]
        pixels = await self.images.from_base64(request, items, where)
        return await self.answer(request, pixels, body.encoding_format)

    async def embed_image(self, request: Request) -> Response:
        encoding = request.query_params.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise InvalidRequestError(f"encoding_format must be float or base64, got {encoding!r}")
        pixels = await self.images.from_body(request, "/v1/embeddings")
        return await self.answer(request, [pixels], encoding)

    async def answer(self, request: Request, pixels: list[np.ndarray], encoding: str | None) -> Response:
        service = service_of(request)
        items = await service.infer(pixels, image_buckets(pixels))
        answer = embeddings_answer([item[OUTPUT] for item in items], encoding, service.model_name, 0)
        return json_response(answer, headers=space_headers(request))


TASK = ServingTask(name="image-embedding", open=ImageEmbeddingRuntime)
