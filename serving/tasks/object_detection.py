"""Serving object detectors: `POST /v1/detect` (the image bytes), `POST /v1/detect/json` (base64 in
JSON), and the Open Inference Protocol with one input `images` (UINT8, `[n, height, width, 3]`)
and four outputs, every image's detections end to end: `boxes` (FP32 `[k, 4]`), `scores`,
`labels` and `batch_index` (INT64: which image of the request each detection is of).

A detection is `{"box": [x0, y0, x1, y1], "label", "index", "score"}`, the box's corners in the
image's own pixels (after EXIF orientation), best score first. The graph keeps detections above
the bundle's score threshold, after non-maximum suppression, at most its `max_detections`; a
request may ask for fewer (`min_score` at or above the threshold, `top_k`), never for more: a
`min_score` below the threshold the bundle was gated at is refused (400), not silently raised.

Images are decoded off the event loop by the engine's decoder (serving/images.py). A graph that
takes batches (the letterbox is in it) batches images of one size; torchvision's detectors are
exported for one image a call (the bundle's `max_batch`).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.contracts.object_detection import BOXES, LABELS, SCORES, ObjectDetectionSettings
from ortpack.kernel.engine import Item
from ortpack.kernel.engines.images import ImageEngine
from ortpack.serving.bodies import PositiveInt, component_schemas, read_body_as, worded
from ortpack.serving.errors import InvalidRequestError
from ortpack.serving.http import RouteSpec, json_response, service_of
from ortpack.serving.images import EXAMPLE_PNG, MEDIA, ImageInputs, image_buckets
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as

# ---------------------------------------------------------------- request and answer

Base64 = Annotated[str, Field(description="base64 or a data: URL")]
Score = Annotated[float, Field(ge=0.0, le=1.0), worded("must be a number in [0, 1]")]


class DetectJsonRequest(BaseModel):
    """One image (`image`) or several (`images`), as base64; at most `top_k` detections each,
    scoring at least `min_score`."""

    model_config = ConfigDict(
        strict=True, json_schema_extra={"oneOf": [{"required": ["image"]}, {"required": ["images"]}]}
    )

    image: Annotated[Base64 | None, worded("must be a base64 string")] = None
    images: Annotated[
        Annotated[list[Base64], Field(min_length=1)] | None,
        worded("must be a non-empty list of base64 strings", item="must be a base64 string"),
    ] = None
    min_score: Score | None = None
    top_k: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_of(self) -> DetectJsonRequest:
        if (self.image is None) == (self.images is None):
            raise InvalidRequestError("send a JSON object with 'image' (base64) or 'images' (a list of base64)")
        return self


class Detection(BaseModel):
    box: Annotated[list[float], Field(min_length=4, max_length=4, description="x0, y0, x1, y1 in the image's pixels")]
    label: str
    index: int
    score: float


class ImageDetections(BaseModel):
    index: int
    width: int
    height: int
    detections: list[Detection]


class Detections(BaseModel):
    """One image's `detections` (with its `width` and `height`), or each image's under `data`."""

    model: str
    width: int | None = None
    height: int | None = None
    detections: list[Detection] | None = None
    data: list[ImageDetections] | None = None


class ObjectDetectionRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        manifest, config = ctx.manifest, ctx.config
        settings = manifest.task_settings
        if not isinstance(settings, ObjectDetectionSettings):
            raise ValueError(f"not an object-detection bundle: {manifest.task}")
        self.images = ImageInputs(
            engine_as(ctx, ImageEngine).decoder,
            workers=config.worker_count,
            max_items=config.max_items,
            max_image_pixels=config.max_image_pixels,
        )
        self.labels = settings.labels
        self.thresholds = settings.thresholds

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        pixels = self.images.from_v2(inputs[IMAGES.name])
        return pixels, image_buckets(pixels)

    def requested(self, min_score: str | float | None, top_k: str | int | None) -> tuple[float, int]:
        """A request's (min_score, top_k), checked against what the graph keeps."""
        t = self.thresholds
        if min_score is None:
            score = t.score
        else:
            try:
                score = float(min_score)  # a query string or a JSON number
            except ValueError:
                raise InvalidRequestError(f"min_score must be a number, got {min_score!r}") from None
            if not t.score <= score <= 1.0:
                raise InvalidRequestError(
                    f"min_score must be in [{t.score:g}, 1]: the model keeps detections scoring {t.score:g} or more "
                    f"(its export's score threshold, the one its parity gate checked), got {score:g}"
                )
        if top_k is None:
            return score, t.max_detections
        if isinstance(top_k, str) and top_k.isdigit():
            top_k = int(top_k)
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= t.max_detections:
            raise InvalidRequestError(f"top_k must be an integer in 1..{t.max_detections}, got {top_k!r}")
        return score, top_k

    def answer(self, item: Item, image: np.ndarray, min_score: float, top_k: int) -> dict[str, Any]:
        keep = np.flatnonzero(item[SCORES] >= min_score)[:top_k]  # best first already
        detections = [
            {
                "box": [round(float(v), 2) for v in item[BOXES][i]],
                "label": self.label(int(item[LABELS][i])),
                "index": int(item[LABELS][i]),
                "score": float(item[SCORES][i]),
            }
            for i in keep
        ]
        return {"width": int(image.shape[1]), "height": int(image.shape[0]), "detections": detections}

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    async def detect(
        self, request: Request, pixels: list[np.ndarray], min_score: float, top_k: int
    ) -> list[dict[str, Any]]:
        items = await service_of(request).infer(pixels, image_buckets(pixels))
        return [self.answer(item, image, min_score, top_k) for item, image in zip(items, pixels, strict=True)]

    def routes(self) -> list[RouteSpec]:
        errors = (400, 413, 415, 429, 503, 504)
        query = (
            {"name": "min_score", "in": "query", "required": False, "schema": {"type": "number"}},
            {"name": "top_k", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
        )
        return [
            RouteSpec(
                path="/v1/detect",
                method="POST",
                handler=self.detect_bytes,
                summary="Detect objects in one image sent as its bytes (Content-Type image/jpeg, png or webp)",
                operation_id="detectObjects",
                request_media=MEDIA,
                response_schema="Detections",
                errors=errors,
                parameters=query,
            ),
            RouteSpec(
                path="/v1/detect/json",
                method="POST",
                handler=self.detect_json,
                summary="Detect objects in images sent as base64 in JSON",
                operation_id="detectObjectsJson",
                request_schema="DetectJsonRequest",
                request_example={"image": EXAMPLE_PNG},
                response_schema="Detections",
                errors=errors,
            ),
        ]

    def schemas(self) -> dict[str, Any]:
        return component_schemas([DetectJsonRequest], [Detections])

    def describe(self) -> str:
        return "object detection: /v1/detect and the Open Inference Protocol v2"

    async def detect_bytes(self, request: Request) -> Response:
        """The image itself as the body; `min_score` and `top_k` in the query."""
        query = request.query_params
        min_score, top_k = self.requested(query.get("min_score"), query.get("top_k"))
        pixels = await self.images.from_body(request, "/v1/detect/json")
        (answer,) = await self.detect(request, [pixels], min_score, top_k)
        return json_response({"model": service_of(request).model_name, **answer})

    async def detect_json(self, request: Request) -> Response:
        """{"image": base64} or {"images": [base64, ...]}, optional "min_score" and "top_k"."""
        body = await read_body_as(request, DetectJsonRequest, lift="image")
        min_score, top_k = self.requested(body.min_score, body.top_k)
        pixels, single = await self.images.from_json(request, body.image, body.images)
        answers = await self.detect(request, pixels, min_score, top_k)
        model = service_of(request).model_name
        if single:
            return json_response({"model": model, **answers[0]})
        return json_response({"model": model, "data": [{"index": i, **a} for i, a in enumerate(answers)]})


TASK = ServingTask(name="object-detection", open=ObjectDetectionRuntime)
