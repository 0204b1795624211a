"""Images in requests, for every task whose inputs are images: the raw bytes of one image as the
body, base64 strings (or `data:` URLs) in JSON, and the Open Inference Protocol's UINT8 `images`
tensor. Each becomes decoded RGB pixels (uint8 `[height, width, 3]`, EXIF orientation applied)
by the engine's decoder (kernel/images.py, in the decode mode the bundle's gate validated) on a
pool of decode threads, one per model worker, so decoding never oversubscribes the cores however
many requests arrive at once (Pillow releases the GIL). A task plugin holds one `ImageInputs`.
"""

from __future__ import annotations

import asyncio
import contextvars
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import Request

from ortpack.kernel.images import ImageDecoder, decode_base64
from ortpack.serving.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from ortpack.serving.http import config_of, lifted_value, read_body, service_of

if TYPE_CHECKING:
    from ortpack.serving.tasks.contract import InferInput

MEDIA = ("image/jpeg", "image/png", "image/webp")
# An 8x8 PNG, base64: an example request body (any JPEG, PNG or WebP works).
EXAMPLE_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAGUlEQVR42mNkYGhQYGDARCwMCgxYweCUAABobwJednxjlwAAAABJRU5ErkJggg=="
)


class ImageInputs:
    """Decoding a request's images with `decoder`, within the server's limits."""

    def __init__(self, decoder: ImageDecoder, *, workers: int, max_items: int, max_image_pixels: int) -> None:
        self.decoder = decoder
        self.max_items = max_items
        self.max_image_pixels = max_image_pixels
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ortpack-decode")

    async def off_loop(self, work: Any, *args: Any) -> Any:
        """`work(*args)` on a decode thread, in the request's context (its memory is held there)."""
        run = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self.pool, run, work, *args)

    async def from_body(self, request: Request, json_route: str) -> np.ndarray:
        """The request's body, an image file (Content-Type image/*), decoded."""
        kind = request.headers.get("content-type", "")
        if not kind.startswith("image/"):
            raise UnsupportedMediaTypeError(
                f"send the image bytes with Content-Type image/*, not {kind!r} (or base64 JSON to {json_route})"
            )
        data = await read_body(request, config_of(request).max_body_bytes)
        hold = service_of(request).hold_pixels
        pixels: np.ndarray = await self.off_loop(self.decoder.decode, data, "the request body", hold)
        return pixels

    async def from_base64(self, request: Request, items: list[str], where: list[str]) -> list[np.ndarray]:
        """Base64 strings (or data: URLs), each decoded; `where` names each in errors. Each image's
        pixels are held in the server's memory budget from its header, before it is decoded. An
        item that the body reader lifted (`read_body_as(..., lift=)`) is decoded from the body's
        own bytes."""
        if len(items) > self.max_items:
            raise PayloadTooLargeError(f"'images' has {len(items)} images; the limit is {self.max_items}")
        items = [lifted_value(request, x) for x in items]
        decoder, hold = self.decoder, service_of(request).hold_pixels
        decoded: list[np.ndarray] = await self.off_loop(
            lambda: [decoder.decode(decode_base64(x, w), w, hold) for x, w in zip(items, where, strict=True)]
        )
        return decoded

    async def from_json(
        self, request: Request, image: str | None, images: list[str] | None
    ) -> tuple[list[np.ndarray], bool]:
        """A JSON request's `image` (one base64 string) or `images` (a list), decoded, and whether it
        sent one (its answer is then the image's own, not a `data` list)."""
        if image is not None:
            return await self.from_base64(request, [image], ["image"]), True
        items = images or []
        return await self.from_base64(request, items, [f"images[{i}]" for i in range(len(items))]), False

    def from_v2(self, tensor: InferInput) -> list[np.ndarray]:
        """An Open Inference Protocol UINT8 tensor `[n, height, width, 3]` (row-major, flat data):
        its n images."""
        name, shape = tensor.name, tensor.shape
        if (
            not isinstance(shape, list)
            or len(shape) != 4
            or shape[3] != 3
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        ):
            raise InvalidRequestError(f"input '{name}' shape must be [n, height, width, 3], got {shape!r}")
        n, height, width, _ = shape
        if n > self.max_items:
            raise PayloadTooLargeError(f"input '{name}' has {n} images; the limit is {self.max_items}")
        if height * width > self.max_image_pixels:
            raise PayloadTooLargeError(f"images of {width}x{height} exceed the {self.max_image_pixels}-pixel limit")
        data = tensor.data
        if isinstance(data, np.ndarray) and data.dtype == np.uint8:  # binary tensor data: checked as it is
            if data.ndim != 1 or data.size != n * height * width * 3:
                raise InvalidRequestError(f"input '{name}' has shape {shape} but {data.size} elements")
            return list(data.reshape(n, height, width, 3))
        if isinstance(data, list) and data and isinstance(data[0], list):
            raise InvalidRequestError(f"input '{name}' data must be flat (row-major)")
        try:
            array = np.asarray(data, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidRequestError(f"input '{name}' data must be integers 0..255") from None
        if array.ndim != 1 or array.size != n * height * width * 3:
            raise InvalidRequestError(f"input '{name}' has shape {shape} but {array.size} elements")
        if array.size and (array.min() < 0 or array.max() > 255):
            raise InvalidRequestError(f"input '{name}' data must be integers 0..255")
        return list(array.astype(np.uint8).reshape(n, height, width, 3))


def image_buckets(images: list[np.ndarray]) -> list[Any]:
    """Each image's bucket: its size (images of one size share a batch)."""
    return [image.shape[:2] for image in images]
