"""Natural photographs for the image gates: scikit-image's bundled sample images (shipped in its
wheel; nothing is downloaded), made varied by random crops, rescales and JPEG/PNG re-encodes.

Three disjoint sets, written as files the way a user's own photos would be:
- `calibration`: for static int8 (crops of the shared sources, other boxes and seeds);
- `validation`: what the parity gate runs (`--validation-images`);
- `heldout`: photos of sources neither of the others uses, for agreement the gate did not see.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# colour and greyscale photographs among scikit-image's samples
SHARED = ("astronaut", "chelsea", "coffee", "motorcycle_left", "hubble_deep_field", "retina", "ihc", "camera",
          "moon", "brick", "grass", "clock_motion", "cell")  # fmt: skip
HELDOUT = ("rocket", "motorcycle_right", "coins", "gravel", "color")
FILES = {"rocket": "rocket.jpg", "hubble_deep_field": "hubble_deep_field.jpg", "retina": "retina.jpg"}


def encode(image: np.ndarray, fmt: str, **options: object) -> bytes:
    """An image (uint8 [height, width, 3]) encoded by Pillow as `fmt` (JPEG, PNG, WEBP, GIF...)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, fmt, **options)
    return buf.getvalue()


@dataclass(frozen=True)
class PhotoSets:
    calibration: Path
    validation: Path
    heldout: Path


def source_image(name: str) -> np.ndarray:
    """One sample image as uint8 RGB [H, W, 3]."""
    import skimage
    from PIL import Image

    path = Path(skimage.__file__).parent / "data" / FILES.get(name, f"{name}.png")
    with Image.open(path) as image:
        return np.array(image.convert("RGB"))


def variant(image: np.ndarray, rng: np.random.Generator) -> tuple[bytes, str]:
    """A random crop (30-100% of the area, aspect 0.6-1.7), rescaled so its shorter side is 160 to
    1600 px, encoded as JPEG (quality 60-95, 4:2:0 or 4:4:4) or, one in five, PNG."""
    from PIL import Image

    h, w = image.shape[:2]
    area = rng.uniform(0.3, 1.0) * h * w
    aspect = float(np.exp(rng.uniform(np.log(0.6), np.log(1.7))))
    ch, cw = min(h, int(np.sqrt(area / aspect))), min(w, int(np.sqrt(area * aspect)))
    top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = Image.fromarray(image[top : top + ch, left : left + cw])
    short = float(rng.uniform(160, 1600))
    scale = short / min(ch, cw)
    crop = crop.resize((max(1, round(cw * scale)), max(1, round(ch * scale))), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    if rng.uniform() < 0.2:
        crop.save(buffer, "PNG")
        return buffer.getvalue(), "png"
    crop.save(buffer, "JPEG", quality=int(rng.integers(60, 96)), subsampling=int(rng.choice([0, 2])))
    return buffer.getvalue(), "jpg"


def write_photo_sets(root: Path, *, validation: int = 48, calibration: int = 32, heldout: int = 40) -> PhotoSets:
    """Write the three sets under `root` (calibration/, validation/, heldout/); deterministic."""
    sets = PhotoSets(root / "calibration", root / "validation", root / "heldout")
    plan = ((sets.validation, SHARED, validation, 1), (sets.calibration, SHARED, calibration, 2),
            (sets.heldout, HELDOUT, heldout, 3))  # fmt: skip
    sources = {name: source_image(name) for name in (*SHARED, *HELDOUT)}
    for directory, names, count, seed in plan:
        directory.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        for i in range(count):
            name = names[i % len(names)]
            data, suffix = variant(sources[name], rng)
            (directory / f"{i:03d}-{name}.{suffix}").write_bytes(data)
    return sets
