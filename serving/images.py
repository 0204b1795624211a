"""Image bytes in, uint8 pixels out: decoding happens outside the graph (preprocessing inside).

JPEG, PNG and WebP through Pillow (the `image` extra), EXIF orientation applied, converted to RGB.
Every way a file can be bad gets its own one-line 4xx: not an image (400), a format we do not
take (415), truncated or corrupt (400), empty (400), too many pixels (413, checked from the
header before anything is decoded, so a decompression bomb never expands).
"""

from __future__ import annotations

import base64
import binascii
import io

import numpy as np

from serving.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

FORMATS = ("JPEG", "PNG", "WEBP")


class ImageDecoder:
    def __init__(self, max_pixels: int, draft_size: int | None = None) -> None:
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover - the image extra is missing
            raise RuntimeError("image bundles need Pillow: install ortpack[image]") from None
        self.max_pixels = max_pixels
        # With draft_size, JPEGs are decoded at the smallest DCT scale (1/2, 1/4, 1/8) that keeps
        # both sides >= draft_size: 4.8 instead of 12 ms for a 1600x1200 photo, and the graph then
        # resizes a 400x300 image. An approximation of the full decode the parity gate validated.
        self.draft_size = draft_size
        # Our check reads the size from the header before anything is decoded; Pillow's own
        # (at open) would fire first with another message, so it is left to ours.
        Image.MAX_IMAGE_PIXELS = None

    def decode(self, data: bytes, where: str = "image") -> np.ndarray:
        """uint8 [height, width, 3] RGB."""
        import warnings

        from PIL import Image, ImageOps, UnidentifiedImageError

        if not data:
            raise InvalidRequestError(f"{where} is empty")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image = Image.open(io.BytesIO(data))
                if image.format not in FORMATS:
                    raise UnsupportedMediaTypeError(f"{where} is {image.format}; send JPEG, PNG or WebP")
                width, height = image.size
                if width * height > self.max_pixels or width == 0 or height == 0:
                    raise PayloadTooLargeError(
                        f"{where} is {width}x{height} ({width * height / 1e6:.1f} megapixels); "
                        f"the limit is {self.max_pixels / 1e6:.1f}"
                    )
                if self.draft_size and image.format == "JPEG":
                    image.draft("RGB", (self.draft_size, self.draft_size))
                image.load()
                rgb = ImageOps.exif_transpose(image).convert("RGB")
        except (UnsupportedMediaTypeError, PayloadTooLargeError):
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise PayloadTooLargeError(f"{where} has too many pixels (limit {self.max_pixels / 1e6:.1f} MP)") from None
        except UnidentifiedImageError:
            raise InvalidRequestError(f"{where} is not an image (JPEG, PNG or WebP)") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise InvalidRequestError(f"{where} is truncated or corrupt: {exc}") from None
        return np.asarray(rgb, dtype=np.uint8)

    def decode_base64(self, text: object, where: str) -> np.ndarray:
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where} must be a base64 string")
        if text.startswith("data:"):  # a data URL: data:image/jpeg;base64,....
            text = text.partition(",")[2]
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"{where} is not valid base64") from None
        return self.decode(data, where)


def top_k(probabilities: np.ndarray, labels: list[str], k: int) -> list[dict[str, object]]:
    k = min(k, len(probabilities))
    best = np.argpartition(-probabilities, k - 1)[:k]
    best = best[np.argsort(-probabilities[best])]
    return [
        {"label": labels[i] if i < len(labels) else str(i), "index": int(i), "probability": float(probabilities[i])}
        for i in best
    ]
