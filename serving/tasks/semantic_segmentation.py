"""Serving semantic segmenters: `POST /v1/segment` (the image bytes), `POST /v1/segment/json`
(base64 in JSON), and the Open Inference Protocol with one input `images` (UINT8, `[n, height,
width, 3]`) and one output `label_map` (UINT8, `[n, height, width]`: each pixel's class).

An answer describes each image's map at the image's own size (after EXIF orientation): the
classes it holds (`index`, `label`, `pixels`, `share`) and the map itself in the requested
`format`:

- `png` (default): `label_map`, a base64 greyscale PNG whose pixel values are class indices
  (lossless; `Image.open(...)` gives the map back);
- `rle`: `masks`, one per class present: COCO's uncompressed run-length encoding
  (`{"size": [height, width], "counts": [...]}`, column-major, starting with a run of zeros:
  pycocotools' `frPyObjects` reads it);
- `classes`: the class list alone.

`POST /v1/segment` with `Accept: image/png` answers the PNG itself (the class names are the
bundle's labels, in its manifest), so `curl --data-binary @photo.jpg -H 'Content-Type: image/jpeg'
-H 'Accept: image/png'` writes the map to a file. Maps are encoded off the event loop on the decode
threads (zlib releases the GIL). An image whose logits, resized back to it, would take more than
1 GiB (12.8 MP at 21 classes, 1.8 MP at 150) is refused with 413 from its header, before decoding.
"""

from __future__ import annotations

import base64
import io
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import Response

from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.contracts.semantic_segmentation import OUTPUT, SemanticSegmentationSettings
from ortpack.kernel.engines.semantic_segmentation import SegmentationEngine
from ortpack.serving.bodies import component_schemas, read_body_as, worded
from ortpack.serving.errors import InvalidRequestError
from ortpack.serving.http import RouteSpec, json_response, service_of
from ortpack.serving.images import EXAMPLE_PNG, MEDIA, ImageInputs, image_buckets
from ortpack.serving.tasks.contract import InferInput, LoadContext, ServingTask, engine_as

FORMATS = ("png", "rle", "classes")
Format = Literal["png", "rle", "classes"]

# ---------------------------------------------------------------- request and answer

Base64 = Annotated[str, Field(description="base64 or a data: URL")]


class SegmentJsonRequest(BaseModel):
    """One image (`image`) or several (`images`), as base64; the map in `format`."""

    model_config = ConfigDict(
        strict=True, json_schema_extra={"oneOf": [{"required": ["image"]}, {"required": ["images"]}]}
    )

    image: Annotated[Base64 | None, worded("must be a base64 string")] = None
    images: Annotated[
        Annotated[list[Base64], Field(min_length=1)] | None,
        worded("must be a non-empty list of base64 strings", item="must be a base64 string"),
    ] = None
    format: Annotated[Format, worded("must be one of png, rle, classes")] = "png"

    @model_validator(mode="after")
    def _one_of(self) -> SegmentJsonRequest:
        if (self.image is None) == (self.images is None):
            raise InvalidRequestError("send a JSON object with 'image' (base64) or 'images' (a list of base64)")
        return self


class SegmentClass(BaseModel):
    index: int
    label: str
    pixels: int
    share: float


class RunLength(BaseModel):
    size: Annotated[list[int], Field(min_length=2, max_length=2, description="height, width")]
    counts: Annotated[list[int], Field(description="column-major runs, zeros first (COCO's uncompressed RLE)")]


class Mask(BaseModel):
    index: int
    label: str
    rle: RunLength


class ImageSegmentation(BaseModel):
    index: int
    width: int
    height: int
    classes: list[SegmentClass]
    label_map: str | None = Field(default=None, description="base64 PNG, 8-bit greyscale: pixel value = class index")
    masks: list[Mask] | None = None


class Segmentation(BaseModel):
    """One image's map (`width`, `height`, `classes`, and `label_map` or `masks`), or each
    image's under `data`."""

    model: str
    width: int | None = None
    height: int | None = None
    classes: list[SegmentClass] | None = None
    label_map: str | None = None
    masks: list[Mask] | None = None
    data: list[ImageSegmentation] | None = None


def encode_png(label_map: np.ndarray) -> bytes:
    """The map as an 8-bit greyscale PNG (fast zlib level: maps compress well anyway)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(label_map, dtype=np.uint8), mode="L").save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def run_lengths(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE of a boolean mask: runs over its column-major pixels, alternately
    false and true, starting with false (a mask that starts true has a first run of 0)."""
    flat = np.asarray(mask, dtype=bool).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat.size and flat[0]:
        counts.insert(0, 0)
    return [int(c) for c in counts]


class SemanticSegmentationRuntime:
    def __init__(self, ctx: LoadContext) -> None:
        manifest, config = ctx.manifest, ctx.config
        settings = manifest.task_settings
        if not isinstance(settings, SemanticSegmentationSettings):
            raise ValueError(f"not a semantic-segmentation bundle: {manifest.task}")
        engine = engine_as(ctx, SegmentationEngine)
        self.images = ImageInputs(
            engine.decoder,
            workers=config.worker_count,
            max_items=config.max_items,
            max_image_pixels=engine.max_image_pixels,  # the map's budget (kernel/engines/semantic_segmentation.py)
        )
        self.labels = settings.labels

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        pixels = self.images.from_v2(inputs[IMAGES.name])
        return pixels, image_buckets(pixels)

    def label(self, index: int) -> str:
        return self.labels[index] if 0 <= index < len(self.labels) else str(index)

    def describe_map(self, label_map: np.ndarray, form: str) -> dict[str, Any]:
        """One image's answer (see the module): runs on a decode thread."""
        height, width = label_map.shape
        counts = np.bincount(label_map.reshape(-1), minlength=1)
        present = np.flatnonzero(counts)
        classes = [
            {
                "index": int(c),
                "label": self.label(int(c)),
                "pixels": int(counts[c]),
                "share": round(float(counts[c]) / max(label_map.size, 1), 6),
            }
            for c in present
        ]
        answer: dict[str, Any] = {"width": int(width), "height": int(height), "classes": classes}
        if form == "png":
            answer["label_map"] = base64.b64encode(encode_png(label_map)).decode("ascii")
        elif form == "rle":
            answer["masks"] = [
                {
                    "index": int(c),
                    "label": self.label(int(c)),
                    "rle": {"size": [int(height), int(width)], "counts": run_lengths(label_map == c)},
                }
                for c in present
            ]
        return answer

    @staticmethod
    def requested_format(value: str | None) -> str:
        if value is None:
            return "png"
        if value not in FORMATS:
            raise InvalidRequestError(f"format must be one of {', '.join(FORMATS)}, got {value!r}")
        return value

    async def segment(self, request: Request, pixels: list[np.ndarray]) -> list[np.ndarray]:
        items = await service_of(request).infer(pixels, image_buckets(pixels))
        return [item[OUTPUT] for item in items]

    def routes(self) -> list[RouteSpec]:
        errors = (400, 413, 415, 429, 503, 504)
        query = (
            {
                "name": "format",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": list(FORMATS), "default": "png"},
            },
        )
        return [
            RouteSpec(
                path="/v1/segment",
                method="POST",
                handler=self.segment_bytes,
                summary=(
                    "Segment one image sent as its bytes (Content-Type image/jpeg, png or webp); "
                    "Accept: image/png answers the label map itself"
                ),
                operation_id="segmentImage",
                request_media=MEDIA,
                response_schema="Segmentation",
                errors=errors,
                parameters=query,
            ),
            RouteSpec(
                path="/v1/segment/json",
                method="POST",
                handler=self.segment_json,
                summary="Segment images sent as base64 in JSON",
                operation_id="segmentImagesJson",
                request_schema="SegmentJsonRequest",
                request_example={"image": EXAMPLE_PNG},
                response_schema="Segmentation",
                errors=errors,
            ),
        ]

    def schemas(self) -> dict[str, Any]:
        return component_schemas([SegmentJsonRequest], [Segmentation])

    def describe(self) -> str:
        return "semantic segmentation: /v1/segment and the Open Inference Protocol v2"

    async def segment_bytes(self, request: Request) -> Response:
        """The image itself as the body; `format` in the query, or `Accept: image/png`."""
        wants_png = request.headers.get("accept", "").split(";")[0].strip() == "image/png"
        form = self.requested_format(request.query_params.get("format"))
        pixels = await self.images.from_body(request, "/v1/segment/json")
        (label_map,) = await self.segment(request, [pixels])
        if wants_png:
            png = await self.images.off_loop(encode_png, label_map)
            return Response(png, 200, media_type="image/png")
        answer = await self.images.off_loop(self.describe_map, label_map, form)
        return json_response({"model": service_of(request).model_name, **answer})

    async def segment_json(self, request: Request) -> Response:
        """{"image": base64} or {"images": [base64, ...]}, optional "format"."""
        body = await read_body_as(request, SegmentJsonRequest, lift="image")
        pixels, single = await self.images.from_json(request, body.image, body.images)
        maps = await self.segment(request, pixels)
        answers = await self.images.off_loop(lambda: [self.describe_map(m, body.format) for m in maps])
        model = service_of(request).model_name
        if single:
            return json_response({"model": model, **answers[0]})
        return json_response({"model": model, "data": [{"index": i, **a} for i, a in enumerate(answers)]})


TASK = ServingTask(name="semantic-segmentation", open=SemanticSegmentationRuntime)
