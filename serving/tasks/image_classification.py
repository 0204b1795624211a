"""Serving image classifiers: `POST /v1/classify` (the image bytes), `POST /v1/classify/json`
(base64 in JSON), and the Open Inference Protocol with one input `images` (UINT8,
`[n, height, width, 3]`) and one output `probabilities` (FP32, `[n, classes]`).

Images are decoded off the event loop on a pool of decode threads (one per model worker; Pillow
releases the GIL) by the engine's decoder, in the decode mode the bundle's parity gate validated
for the served variant (kernel/images.py, kernel/engines/images.py); the graph resizes, crops and
normalises. Images of one size share a
batch (the bucket is the size), and a batch also stops at --max-batch-pixels. The JSON request
and the answers are the pydantic models below: the same models parse requests and write the
OpenAPI schemas.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.image_classification import IMAGES, OUTPUT, ImageClassificationSettings
from ortpack.kernel.engines.images import ImageEngine
from ortpack.serving.bodies import PositiveInt, component_schemas, read_body_as, worded
from ortpack.serving.errors import InvalidRequestError
from ortpack.serving.http import RouteSpec, json_response, service_of
from ortpack.serving.images import EXAMPLE_PNG, MEDIA, ImageInputs, image_buckets
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as

# ---------------------------------------------------------------- request and answer

Base64 = Annotated[str, Field(description="base64 or a data: URL")]


class ClassifyJsonRequest(BaseModel):
    """One image (`image`) or several (`images`), as base64; `top_k` classes each."""

    model_config = ConfigDict(
        strict=True, json_schema_extra={"oneOf": [{"required": ["image"]}, {"required": ["images"]}]}
    )

    image: Annotated[Base64 | None, worded("must be a base64 string")] = None
    images: Annotated[
        Annotated[list[Base64], Field(min_length=1)] | None,
        worded("must be a non-empty list of base64 strings", item="must be a base64 string"),
    ] = None
    top_k: PositiveInt | None = 5

    @model_validator(mode="after")
    def _one_of(self) -> ClassifyJsonRequest:
        if (self.image is None) == (self.images is None):
            raise InvalidRequestError("send a JSON object with 'image' (base64) or 'images' (a list of base64)")
        return self


class Prediction(BaseModel):
    label: str
    index: int
    probability: float


class ImagePredictions(BaseModel):
    index: int
    predictions: list[Prediction]


class Classification(BaseModel):
    """One image's `predictions`, or each image's under `data`."""

    model: str
    predictions: list[Prediction] | None = None
    data: list[ImagePredictions] | None = None


def top_k(probabilities: np.ndarray, labels: list[str], k: int) -> list[dict[str, object]]:
    k = min(k, len(probabilities))
    best = np.argpartition(-probabilities, k - 1)[:k]
    best = best[np.argsort(-probabilities[best])]
    return [
        {"label": labels[i] if i < len(labels) else str(i), "index": int(i), "probability": float(probabilities[i])}
        for i in best
    ]


class ImageClassificationRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        manifest, config = ctx.manifest, ctx.config
        settings = manifest.task_settings
        if not isinstance(settings, ImageClassificationSettings):
            raise ValueError(f"not an image-classification bundle: {manifest.task}")
        self.images = ImageInputs(
            engine_as(ctx, ImageEngine).decoder,
            workers=config.worker_count,
            max_items=config.max_items,
            max_image_pixels=config.max_image_pixels,
        )
        self.output_dim = manifest.sizes["classes"]
        self.labels = settings.labels or [str(i) for i in range(self.output_dim)]

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        pixels = self.images.from_v2(inputs[IMAGES.name])
        return pixels, image_buckets(pixels)

    def requested_top_k(self, value: object) -> int:
        if value is None:
            return 5
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= self.output_dim:
            raise InvalidRequestError(f"top_k must be an integer in 1..{self.output_dim}, got {value!r}")
        return value

    def routes(self) -> list[RouteSpec]:
        errors = (400, 413, 415, 429, 503, 504)
        top = {"name": "top_k", "in": "query", "required": False, "schema": {"type": "integer", "default": 5}}
        return [
            RouteSpec(
                path="/v1/classify",
                method="POST",
                handler=self.classify_bytes,
                summary="Classify one image sent as its bytes (Content-Type image/jpeg, image/png or image/webp)",
                operation_id="classifyImage",
                request_media=MEDIA,
                response_schema="Classification",
                errors=errors,
                parameters=(top,),
            ),
            RouteSpec(
                path="/v1/classify/json",
                method="POST",
                handler=self.classify_json,
                summary="Classify images sent as base64 in JSON",
                operation_id="classifyImagesJson",
                request_schema="ClassifyJsonRequest",
                request_example={"image": EXAMPLE_PNG},
                response_schema="Classification",
                errors=errors,
            ),
        ]

    def schemas(self) -> dict[str, Any]:
        return component_schemas([ClassifyJsonRequest], [Classification])

    def describe(self) -> str:
        return "image classification: /v1/classify and the Open Inference Protocol v2"

    async def classify(self, request: Request, pixels: list[np.ndarray], k: int) -> list[list[dict[str, object]]]:
        """Each image's top `k` classes, picked on the model thread (numpy's argpartition releases
        the GIL: on the event loop it would wait behind the decode and model threads)."""
        labels = self.labels
        return await service_of(request).infer(
            pixels, image_buckets(pixels), shape=lambda item: top_k(item[OUTPUT], labels, k)
        )

    async def classify_bytes(self, request: Request) -> Response:
        """The image itself as the body."""
        k = self.requested_top_k(request.query_params.get("top_k"))
        pixels = await self.images.from_body(request, "/v1/classify/json")
        (predictions,) = await self.classify(request, [pixels], k)
        return json_response({"model": service_of(request).model_name, "predictions": predictions})

    async def classify_json(self, request: Request) -> Response:
        """{"image": base64} or {"images": [base64, ...]}, optional "top_k"."""
        body = await read_body_as(request, ClassifyJsonRequest, lift="image")
        k = self.requested_top_k(body.top_k)
        pixels, single = await self.images.from_json(request, body.image, body.images)
        results = await self.classify(request, pixels, k)
        model = service_of(request).model_name
        if single:
            return json_response({"model": model, "predictions": results[0]})
        data = [{"index": i, "predictions": p} for i, p in enumerate(results)]
        return json_response({"model": model, "data": data})


TASK = ServingTask(name="image-classification", open=ImageClassificationRuntime)
