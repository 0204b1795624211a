"""Image bytes in, uint8 pixels out: decoding happens outside the graph (preprocessing inside).

JPEG, PNG and WebP through Pillow (the `image` extra), EXIF orientation applied, converted to RGB.
Every way a file can be bad gets its own one-line error (ortpack.kernel.errors; a server answers
the status in brackets): not an image (400), a format we do not take (415), truncated or corrupt
(400), empty (400), too many pixels (413, checked from the header before anything is decoded, so
a decompression bomb never expands; Pillow's own check, `PIL.Image.MAX_IMAGE_PIXELS`, stays in
force too).

Two decode modes, both covered by the parity gate (components/core/tasks/image_classification.py):
"exact" decodes every pixel, as the PyTorch reference does; "reduced" asks libjpeg for the
smallest DCT scale (1/2, 1/4, 1/8) that keeps the shorter side at least `reduce_to` pixels, so a
large JPEG is decoded, and then resized in the graph, at a fraction of the size. PNG and WebP are
always decoded in full. The server uses a mode only when the bundle's gate validated it for the
variant it serves (`reduced_decode_evidence`).
"""

from __future__ import annotations

import binascii
import contextlib
import io
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ortpack.kernel.contracts.image_classification import CONTRACT
from ortpack.kernel.errors import InputError, InputTooLargeError, UnsupportedInputError
from ortpack.kernel.gates import gate

FORMATS = ("JPEG", "PNG", "WEBP")
DECODE_MODES = ("exact", "reduced")
_ORIENTATION = 0x0112  # the EXIF tag
# EXIF orientation -> the numpy view that shows the picture upright (what ImageOps.exif_transpose does)
_UPRIGHT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}

# The reduced decode's own gate, against the exact decode through the same model (the PyTorch
# reference at export, each variant at validation): it changes pixels by design, so it is judged
# on what a client sees. Top-1 agreement 99.5% on the decisive images (kernel/gates.py: a flip
# between two classes the model itself nearly ties is not a decoding error; the margin was
# measured for it: docs/image-classification.md), top-5 95%, and no probability moving by more
# than 0.1. The variant's own top-1/top-5 gate applies to the served path end to end on top.
DECODE_GATE: dict[str, float] = {
    "min_decisive_top1_agreement": 0.995,
    "min_top5_agreement": 0.95,
    "max_abs_diff": 0.1,
}


class ImageDecoder:
    """Decodes one image file to uint8 `[height, width, 3]` RGB; thread-safe (no shared state)."""

    def __init__(self, max_pixels: int, reduce_to: int = 0) -> None:
        try:
            from PIL import Image
        except ImportError:  # pragma: no cover - the image extra is missing
            raise RuntimeError("image bundles need Pillow: install ortpack[image]") from None
        del Image
        # simplejpeg (the image extra) decodes RGB and greyscale JPEGs with libjpeg-turbo straight
        # into an RGB array: the same pixels as Pillow's (tested), 7.3 instead of 10.1 ms for a
        # 1280x960 photo, and reduced at the DCT scale Pillow's `draft` picks (the scale the gate
        # measured; 3.7 instead of 7.1 ms to 640x480, and without Pillow's decode loop, which
        # takes the GIL back for every 64 KB of the file). Pillow decodes the rest (PNG, WebP,
        # CMYK JPEGs) and everything when simplejpeg is missing.
        self._jpeg: Any = None
        with contextlib.suppress(ImportError):
            import simplejpeg

            self._jpeg = simplejpeg
        self.max_pixels = max_pixels
        # 0: exact (full) decoding; else JPEGs are decoded at the smallest DCT scale that keeps
        # the shorter side >= reduce_to (the "reduced" mode, with the bundle's validated margin)
        self.reduce_to = reduce_to

    @property
    def mode(self) -> str:
        return "reduced" if self.reduce_to else "exact"

    def decode(
        self, data: bytes | bytearray | memoryview, where: str = "image", reserve: Callable[[int], None] | None = None
    ) -> np.ndarray:
        """uint8 [height, width, 3] RGB, EXIF orientation applied. `reserve`, if given, is called with
        the decoded pixels' size in bytes once the header is read, before anything is decoded (a
        server holds them in its memory budget; an exception from it stops the decode)."""
        from PIL import Image, ImageOps, UnidentifiedImageError

        if not data:
            raise InputError(f"{where} is empty")
        try:
            image = Image.open(io.BytesIO(data))
            if image.format not in FORMATS:
                raise UnsupportedInputError(f"{where} is {image.format}; send JPEG, PNG or WebP")
            width, height = image.size
            if width * height > self.max_pixels or width == 0 or height == 0:
                raise InputTooLargeError(
                    f"{where} is {width}x{height} ({width * height / 1e6:.1f} megapixels); "
                    f"the limit is {self.max_pixels / 1e6:.1f}"
                )
            orientation = image.getexif().get(_ORIENTATION, 1)
            if self.reduce_to and image.format == "JPEG":
                image.draft("RGB", (self.reduce_to, self.reduce_to))  # the DCT scale; image.size is now reduced
            if reserve is not None:
                reserve(image.size[0] * image.size[1] * 3)
            if self._jpeg is not None and image.format == "JPEG" and image.mode in ("RGB", "L"):
                # at the size `draft` left (the full one when exact): libjpeg-turbo's scale for it
                # is Pillow's (1/2, 1/4, 1/8 all round up alike)
                width, height = image.size
                pixels = self._jpeg.decode_jpeg(data, colorspace="RGB", min_width=width, min_height=height)
                if pixels.shape[:2] == (height, width):  # any buffer: no copy
                    upright = _UPRIGHT.get(orientation)
                    return np.ascontiguousarray(upright(pixels)) if upright else pixels
            image.load()
            rgb: Image.Image = image
            if orientation != 1 or image.format != "JPEG":  # a PNG's EXIF may follow its pixels
                rgb = ImageOps.exif_transpose(rgb)
            if rgb.mode != "RGB":
                rgb = rgb.convert("RGB")
        except (UnsupportedInputError, InputTooLargeError):
            raise
        except Image.DecompressionBombError:  # Pillow's own limit (twice MAX_IMAGE_PIXELS)
            raise InputTooLargeError(f"{where} has too many pixels (limit {self.max_pixels / 1e6:.1f} MP)") from None
        except UnidentifiedImageError:
            raise InputError(f"{where} is not an image (JPEG, PNG or WebP)") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise InputError(f"{where} is truncated or corrupt: {exc}") from None
        return np.asarray(rgb, dtype=np.uint8)

    def decode_base64(self, text: object, where: str) -> np.ndarray:
        return self.decode(decode_base64(text, where), where)


def _strict_base64() -> Callable[[str | bytes | memoryview], bytes]:
    """The fastest strict base64 decoder here: pybase64's SIMD one (the `image` extra; 0.02 ms for
    a 530 KB photo where binascii takes 0.7 ms, with the GIL held) or binascii's. Both reject what
    is not the alphabet, bad padding and data after it."""
    with contextlib.suppress(ImportError):  # as simplejpeg is found (ImageDecoder)
        import pybase64

        return lambda text: pybase64.b64decode(text, validate=True)
    return lambda text: binascii.a2b_base64(text, strict_mode=True)


_b64decode = _strict_base64()


def decode_base64(text: object, where: str) -> bytes:
    """Strict base64 (a data: URL prefix allowed) to bytes, in one pass (`_strict_base64`), where
    `base64.b64decode(validate=True)` first runs a regular expression over the whole text. A
    memoryview is the text's bytes as they stand in a request body (the server's lifted member)."""
    if isinstance(text, memoryview):
        if text[:5] == b"data:":
            text = bytes(text).partition(b",")[2]
    elif not isinstance(text, str):
        raise InputError(f"{where} must be a base64 string")
    elif text.startswith("data:"):  # a data URL: data:image/jpeg;base64,....
        text = text.partition(",")[2]
    try:
        return _b64decode(text)
    except (binascii.Error, ValueError):
        raise InputError(f"{where} is not valid base64") from None


def reduced_decode_evidence(values: Mapping[str, float], thresholds: Mapping[str, float], reduce_to: int) -> list[str]:
    """Why a variant's parity record does not validate reduced decoding at `reduce_to` (empty: it
    does). The record must hold the reduced path measured at that size, within `DECODE_GATE`
    against the exact decode and within the variant's own top-1/top-5 gate end to end."""

    measured = values.get("decode.reduced.min_side")
    if measured is None:
        return ["the parity gate did not measure reduced decoding for this variant"]
    if int(measured) != reduce_to:
        return [f"the parity gate measured reduced decoding at {int(measured)} pixels, not {reduce_to}"]
    decode = {m: values[f"decode.reduced.{m}"] for m in ("top1_agreement", "top5_agreement", "max_abs_diff")}
    # bundles built before the decisive metric existed: their strict top-1 agreement stands in
    decode["decisive_top1_agreement"] = values.get("decode.reduced.decisive_top1_agreement", decode["top1_agreement"])
    misses = [f"against the exact decode: {m}" for m in gate(decode, DECODE_GATE, CONTRACT.gates)]
    served = {m: values[f"served.reduced.{m}"] for m in ("top1_agreement", "top5_agreement")}
    own = {k: v for k, v in thresholds.items() if k in ("min_top1_agreement", "min_top5_agreement")}
    misses += [f"end to end: {m}" for m in gate(served, own, CONTRACT.gates)]
    return misses


def decode_settings(preprocessing: Any) -> tuple[str, int]:
    """(mode, reduce_to) a bundle's preprocessing section asks for (an older bundle: exact)."""
    mode = str(getattr(preprocessing, "decode", "exact"))
    return mode, int(getattr(preprocessing, "decode_min_side", 0)) if mode == "reduced" else 0


def choose_decoder(
    preprocessing: Any,
    variant: Any,
    requested: str,
    max_pixels: int,
    name: str = "",
    warn: Callable[[str], None] | None = None,
) -> tuple[ImageDecoder, str]:
    """The decoder to serve `variant` with, and why. "exact" always (the reference's own decode);
    "reduced" only when the variant's parity record validates the bundle's reduced decode (else
    ValueError: a server refuses to start); "auto" the bundle's default when validated, else exact
    (`warn` says why). With no variant (the build machine, whose gate is measuring it), the
    bundle's default."""
    if requested not in ("auto", *DECODE_MODES):
        raise ValueError(f"unknown decode mode {requested!r} (auto, {', '.join(DECODE_MODES)})")
    default, side = decode_settings(preprocessing)
    if requested == "exact" or (requested == "auto" and default == "exact"):
        return ImageDecoder(max_pixels), "exact"
    if default != "reduced":
        raise ValueError(f"bundle {name} has no validated reduced decoding (its parity gate chose exact)")
    if variant is None:
        return ImageDecoder(max_pixels, reduce_to=side), f"reduced (JPEGs kept >= {side} px)"
    misses = reduced_decode_evidence(variant.parity.values, variant.parity.thresholds, side)
    if not misses:
        return ImageDecoder(max_pixels, reduce_to=side), f"reduced (JPEGs kept >= {side} px), validated by the gate"
    reason = f"variant {variant.id}'s parity gate does not validate reduced decoding: {'; '.join(misses)}"
    if requested == "reduced":
        raise ValueError(reason)
    if warn is not None:
        warn(f"{reason}; decoding exactly")
    return ImageDecoder(max_pixels), "exact (reduced not validated for this variant)"
