"""The validation sets the project ships (parity inputs, never downloaded)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np


@cache
def validation_sentences() -> tuple[str, ...]:
    """560+ varied sentences: many topics and languages, punctuation, empty-ish strings, and
    paragraphs longer than 256 tokens (they test truncation)."""
    text = resources.files("components.core").joinpath("data/validation_sentences.jsonl").read_text("utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@dataclass(frozen=True)
class ImageSpec:
    """A generated validation image: rendered the same way wherever it is needed (no files)."""

    height: int
    width: int
    kind: str  # "smooth" (gradients and blobs, like photos) or "noisy" (uniform noise, the worst case)
    seed: int


# (height, width) groups of 8 same-size images (batch-8 checks), then single images of odd sizes:
# tiny (upsampled), portrait, landscape, square, off-by-one crops, and larger than 1080p.
_GROUPS = ((224, 224), (480, 640), (640, 480), (300, 451))
_SINGLES = ((17, 23), (96, 64), (257, 300), (224, 225), (1201, 799), (1080, 1920), (1440, 2560), (2000, 1500))


def validation_images(calibration: bool = False) -> tuple[ImageSpec, ...]:
    """The image validation set (40 images); `calibration` gives a disjoint set for int8."""
    base = 10_000 if calibration else 0
    specs = [
        ImageSpec(h, w, "smooth" if i % 4 else "noisy", base + g * 8 + i)
        for g, (h, w) in enumerate(_GROUPS)
        for i in range(8)
    ]
    specs += [ImageSpec(h, w, "smooth" if i % 2 else "noisy", base + 100 + i) for i, (h, w) in enumerate(_SINGLES)]
    return tuple(specs)


def render_image(spec: ImageSpec) -> np.ndarray:
    """uint8 [height, width, 3], RGB."""
    rng = np.random.default_rng(spec.seed)
    if spec.kind == "noisy":
        return rng.integers(0, 256, (spec.height, spec.width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0 : spec.height, 0 : spec.width].astype(np.float32)
    image = np.empty((spec.height, spec.width, 3), dtype=np.float32)
    for c in range(3):
        fx, fy = rng.uniform(2, 40, 2).tolist()
        phase = float(rng.uniform(0, 6.28))
        cy, cx = rng.uniform(0, spec.height), rng.uniform(0, spec.width)
        blob = np.exp(-(((yy - cy) / (0.3 * spec.height + 1)) ** 2 + ((xx - cx) / (0.3 * spec.width + 1)) ** 2))
        image[..., c] = 128 + 60 * np.sin(xx / fx + phase) * np.cos(yy / fy) + 80 * (blob - 0.5)
    image += rng.normal(0, 4, image.shape).astype(np.float32)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """Lossless PNG bytes of a uint8 [height, width, 3] image (Pillow)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()
