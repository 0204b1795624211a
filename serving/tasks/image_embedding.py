"""Serving image embeddings: OpenAI `POST /v1/embeddings` with images in `input` (base64 or
`data:` URLs, as Infinity takes them), `POST /v1/embeddings/image` (one image as its bytes), and
the Open Inference Protocol with one input `images` (UINT8, `[n, height, width, 3]`) and one output
`image_embedding` (FP32, `[n, dim]`).

Images are decoded off the event loop by the engine's decoder (serving/images.py); images of one
size share a batch. Every answer carries `X-Embedding-Space`. `usage` counts no tokens (images have
none): its fields are 0, as OpenAI's schema requires them.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.image_embedding import OUTPUT, ImageEmbeddingSettings
from ortpack.kernel.contracts.images import IMAGES
from ortpack.serving.bodies import component_schemas, read_body_as, worded
from ortpack.serving.errors import InvalidRequestError
from ortpack.serving.http import RouteSpec, check_model, json_response, service_of, space_headers
from ortpack.serving.images import EXAMPLE_PNG, MEDIA, ImageInputs, image_buckets
from ortpack.serving.tasks.contract import LoadContext, ServingTask

Image = Annotated[str, Field(description="an image as base64 or a data: URL (JPEG, PNG or WebP)")]


class ImageEmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request with images as `input`. `dimensions`, when sent, must be the
    model's own; `user` is accepted and ignored."""

    model_config = ConfigDict(strict=True)

    input: Annotated[
        Image | Annotated[list[Image], Field(min_length=1)],
        worded("must be an image (base64 or a data: URL) or a non-empty list of them"),
    ]
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


class ImageEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | Annotated[str, Field(description="base64 little-endian float32")]


class ImageEmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ImageEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ImageEmbedding]
    model: str
    usage: ImageEmbeddingsUsage


class ImageEmbeddingRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        settings = ctx.manifest.task_settings
        if not isinstance(settings, ImageEmbeddingSettings):
            raise ValueError(f"not an image-embedding bundle: {ctx.manifest.task}")
        config = ctx.config
        self.images = ImageInputs(
            ctx.engine.decoder,  # type: ignore[attr-defined]  # an ImageEngine's
            workers=config.worker_count,
            max_items=config.max_items,
            max_image_pixels=config.max_image_pixels,
        )
        self.output_dim = ctx.manifest.sizes["dim"]

    async def v2_payloads(self, tensors: dict[str, dict[str, Any]]) -> tuple[list[Any], list[Any]]:
        pixels = self.images.from_v2(tensors[IMAGES.name])
        return pixels, image_buckets(pixels)

    def routes(self) -> list[RouteSpec]:
        return [
            RouteSpec(
                path="/v1/embeddings",
                method="POST",
                handler=embeddings,
                summary="Embed images sent as base64 or data: URLs (OpenAI-compatible)",
                operation_id="createImageEmbeddings",
                request_schema="ImageEmbeddingsRequest",
                request_example={"input": [EXAMPLE_PNG]},
                response_schema="ImageEmbeddingsResponse",
                errors=(400, 404, 413, 415, 429, 503, 504),
            ),
            RouteSpec(
                path="/v1/embeddings/image",
                method="POST",
                handler=embed_image,
                summary="Embed one image sent as its bytes (Content-Type image/jpeg, png or webp)",
                operation_id="createImageEmbedding",
                request_media=MEDIA,
                response_schema="ImageEmbeddingsResponse",
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
        return component_schemas([ImageEmbeddingsRequest], [ImageEmbeddingsResponse])

    def describe(self) -> str:
        return "image embeddings: OpenAI /v1/embeddings with images and the Open Inference Protocol v2"


async def _answer(request: Request, pixels: list[np.ndarray], encoding: str | None) -> Response:
    service = service_of(request)
    items = await service.infer(pixels, image_buckets(pixels))
    rows = [item[OUTPUT] for item in items]
    if encoding == "base64":
        data: list[dict[str, Any]] = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row.astype("<f4").tobytes()).decode()}
            for i, row in enumerate(rows)
        ]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    answer = {
        "object": "list",
        "data": data,
        "model": service.model_name,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
    return json_response(answer, headers=space_headers(request))


async def embeddings(request: Request) -> Response:
    runtime: ImageEmbeddingRuntime = service_of(request).runtime  # type: ignore[assignment]
    body = await read_body_as(request, ImageEmbeddingsRequest, {"dimensions": runtime.output_dim})
    if body.model is not None:
        check_model(request, body.model, None)
    single = isinstance(body.input, str)
    items = [body.input] if isinstance(body.input, str) else body.input
    where = ["input"] if single else [f"input[{i}]" for i in range(len(items))]
    pixels = await runtime.images.from_base64(items, where)
    return await _answer(request, pixels, body.encoding_format)


async def embed_image(request: Request) -> Response:
    runtime: ImageEmbeddingRuntime = service_of(request).runtime  # type: ignore[assignment]
    encoding = request.query_params.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidRequestError(f"encoding_format must be float or base64, got {encoding!r}")
    pixels = await runtime.images.from_body(request, "/v1/embeddings")
    return await _answer(request, [pixels], encoding)


TASK = ServingTask(name="image-embedding", open=ImageEmbeddingRuntime)
