"""The validation sets the project ships (parity inputs, never downloaded)."""

from __future__ import annotations

import io
import itertools
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from ortpack.components.core.errors import InvalidSpecError


@cache
def validation_sentences() -> tuple[str, ...]:
    """560+ varied sentences: many topics and languages, punctuation, empty-ish strings, and
    paragraphs longer than 256 tokens (they test truncation)."""
    text = resources.files("ortpack.components.core").joinpath("data/validation_sentences.jsonl").read_text("utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@cache
def retrieval_queries() -> tuple[str, ...]:
    """400 short questions people ask support desks and search boxes, shipped with the package:
    the queries of `ortpack bundle diff`'s retrieval set (whose documents are the validation
    sentences), the first 64 also the int8 search's (tasks/text_embedding.py SEARCH_QUERIES), and
    the benchmarks' short inputs (bench/serve_load.py)."""
    text = resources.files("ortpack.components.core").joinpath("data/retrieval_queries.jsonl").read_text("utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@cache
def generation_prompts() -> tuple[str, ...]:
    """16 prompts a decoder's greedy continuations are compared on: prose, a question, code, SQL, a
    list, a letter, German and French, short and long."""
    text = resources.files("ortpack.components.core").joinpath("data/generation_prompts.jsonl").read_text("utf-8")
    return tuple(json.loads(line)["prompt"] for line in text.splitlines() if line.strip())


@cache
def perplexity_text() -> str:
    """~330 words of plain English prose (a lighthouse, cooking, software) a decoder's perplexity is
    measured on, PyTorch's and each variant's."""
    return resources.files("ortpack.components.core").joinpath("data/perplexity_text.txt").read_text("utf-8")


@dataclass(frozen=True)
class SpeechClip:
    """A shipped recording: its file name, what was said, and its samples (float32 mono in [-1, 1])."""

    name: str
    text: str
    samples: np.ndarray
    sampling_rate: int


@cache
def speech_clips() -> tuple[SpeechClip, ...]:
    """Five sentences of English speech (2.7-4.8 s each), made once by espeak-ng in four voices at
    125-180 words a minute and shipped as 16 kHz 16-bit WAV (data/speech.jsonl lists them): what a
    speech model's transcripts are compared on, PyTorch's and each variant's."""
    import wave

    root = resources.files("ortpack.components.core").joinpath("data")
    out = []
    for line in root.joinpath("speech.jsonl").read_text("utf-8").splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        with wave.open(io.BytesIO(root.joinpath(entry["file"]).read_bytes())) as wav:
            if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
                raise InvalidSpecError(f"{entry['file']}: the shipped speech must be 16-bit mono")
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
            out.append(SpeechClip(entry["file"], entry["text"], pcm.astype(np.float32) / 32768.0, wav.getframerate()))
    return tuple(out)


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


# ---------------------------------------------------------------- encoded images (the served path)


@dataclass(frozen=True)
class EncodedImageSpec:
    """A generated validation file as a client sends it: photo-like content encoded as JPEG or
    PNG, with an EXIF orientation, rendered and encoded the same way wherever it is needed."""

    width: int  # as stored in the file (before the EXIF orientation is applied)
    height: int
    content: str  # "photo" (gradients, blobs, sensor noise), "edges" (shapes), "text" (glyph rows), "fine" (chirp)
    format: str  # "JPEG" or "PNG"
    quality: int = 90  # JPEG quality
    subsampling: int = 2  # JPEG chroma subsampling: 0 is 4:4:4, 1 is 4:2:2, 2 is 4:2:0
    orientation: int = 1  # EXIF orientation tag, 1..8 (1: as stored)
    mode: str = "RGB"  # "RGB", "L" (greyscale) or "RGBA" (PNG with alpha)
    seed: int = 0

    @property
    def name(self) -> str:
        tag = f"q{self.quality}s{self.subsampling}" if self.format == "JPEG" else "png"
        return f"{self.width}x{self.height}-{self.content}-{tag}-o{self.orientation}-{self.mode}-{self.seed}"


# (width, height) as stored, from 200x150 to 4000x3000; shorter sides at the boundaries of reduced
# JPEG decoding for a 256 resize (512, 768, 1024, 1536, 2048: exactly 2x, 3x, 4x, 6x, 8x) and
# the sizes phones and cameras write.
_ENCODED_SIZES = (
    (200, 150),
    (150, 200),
    (320, 240),
    (400, 300),
    (640, 480),
    (480, 640),
    (683, 512),
    (800, 600),
    (1024, 768),
    (768, 1024),
    (1280, 960),
    (1365, 1024),
    (1600, 1200),
    (1920, 1080),
    (1080, 1920),
    (2048, 1536),
    (2731, 2048),
    (2592, 1944),
    (3000, 2000),
    (4000, 3000),
)
_CONTENTS = ("photo", "edges", "text", "fine")
_QUALITIES = (95, 90, 75, 85, 50)


def encoded_validation_images(calibration: bool = False) -> tuple[EncodedImageSpec, ...]:
    """The encoded validation set (55 files, about 11 MB): JPEGs of every size (three of each
    up to 1 megapixel, two up to 4, one above) with varied content, quality, chroma subsampling,
    EXIF orientation and greyscale, and small PNGs (RGB, RGBA, greyscale, one with an EXIF
    orientation). `calibration` gives a disjoint set (other seeds)."""
    base = 20_000 if calibration else 0
    specs: list[EncodedImageSpec] = []
    for i, (width, height) in enumerate(_ENCODED_SIZES):
        pixels = width * height
        for j in range(3 if pixels <= 1_000_000 else 2 if pixels <= 4_000_000 else 1):
            k = 3 * i + j
            specs.append(
                EncodedImageSpec(
                    width=width,
                    height=height,
                    content=_CONTENTS[k % len(_CONTENTS)],
                    format="JPEG",
                    quality=_QUALITIES[k % len(_QUALITIES)],
                    subsampling=(2, 2, 0, 1)[k % 4],
                    orientation=(1, 6, 1, 3, 8, 1, 2, 5, 1, 4, 7)[k % 11],
                    mode="L" if k % 13 == 5 else "RGB",
                    seed=base + 1000 + k,
                )
            )
    for i, (width, height) in enumerate(_ENCODED_SIZES[:7]):
        specs.append(
            EncodedImageSpec(
                width=width,
                height=height,
                content=_CONTENTS[(i + 1) % len(_CONTENTS)],
                format="PNG",
                orientation=6 if i == 5 else 1,
                mode=("RGB", "RGBA", "L")[i % 3],
                seed=base + 2000 + i,
            )
        )
    return tuple(specs)


def render_content(spec: EncodedImageSpec) -> np.ndarray:
    """uint8 [height, width, 3] RGB: photo-like content of the spec's kind (before encoding)."""
    rng = np.random.default_rng(spec.seed)
    h, w = spec.height, spec.width
    yy = np.arange(h, dtype=np.float32)[:, None]
    xx = np.arange(w, dtype=np.float32)[None, :]
    # a smooth background: two coloured gradients and a soft blob, like sky, walls and lighting
    image = np.empty((h, w, 3), dtype=np.float32)
    for c in range(3):
        gx, gy = rng.uniform(-90, 90, 2).tolist()
        cy, cx = float(rng.uniform(0, h)), float(rng.uniform(0, w))
        blob = np.exp(-(((yy - cy) / (0.35 * h)) ** 2) - ((xx - cx) / (0.35 * w)) ** 2)
        image[..., c] = float(rng.uniform(70, 180)) + gx * (xx / w - 0.5) + gy * (yy / h - 0.5) + 60 * (blob - 0.4)
    scale = min(h, w) / 480.0  # features scale with the picture, as in photos of one scene
    if spec.content == "photo":
        for c in range(3):
            fx, fy = rng.uniform(6, 40, 2) * scale
            image[..., c] += 30 * np.sin(xx / fx + float(rng.uniform(0, 6.3))) * np.cos(yy / fy)
    elif spec.content == "edges":
        for _ in range(12):  # filled rectangles and discs with hard edges
            colour = rng.uniform(0, 255, 3).astype(np.float32)
            y0, x0 = int(rng.integers(0, h)), int(rng.integers(0, w))
            if rng.random() < 0.5:
                y1, x1 = y0 + int(rng.integers(h // 10, h // 2 + 2)), x0 + int(rng.integers(w // 10, w // 2 + 2))
                image[y0:y1, x0:x1] = colour
            else:
                r = float(rng.uniform(0.05, 0.25)) * min(h, w)
                disc = (yy - y0) ** 2 + (xx - x0) ** 2 <= r * r
                image[disc] = colour
    elif spec.content == "text":
        image = _draw_text(image, rng, max(6, round(8 * scale)))
    elif spec.content == "fine":  # a zone plate: every frequency up to Nyquist, the worst case for resizing
        r2 = ((yy - h / 2) ** 2 + (xx - w / 2) ** 2) / max(h, w)
        image += (50 * np.cos(np.pi * r2 * float(rng.uniform(0.8, 1.0))))[..., None]
    image += rng.normal(0, 3, (h, w, 1)).astype(np.float32)  # sensor noise, the same in every channel
    return np.clip(image, 0, 255).astype(np.uint8)


def _draw_text(image: np.ndarray, rng: np.random.Generator, glyph: int) -> np.ndarray:
    """Rows of dark 3x5-cell glyphs (cell `glyph // 5` pixels) on a light band: a page or a sign."""
    h, w = image.shape[:2]
    cell = max(1, glyph // 5)
    rows, cols = h // (7 * cell), w // (4 * cell)
    if rows == 0 or cols == 0:
        return image
    glyphs = rng.random((rows, cols, 5, 3)) < 0.45  # each character a random 5x3 bitmap
    glyphs[:, rng.random(cols) < 0.18] = False  # spaces between words
    page = np.zeros((rows, 7, cols, 4), dtype=bool)
    page[:, 1:6, :, :3] = glyphs.transpose(0, 2, 1, 3)
    mask = np.repeat(np.repeat(page.reshape(rows * 7, cols * 4), cell, axis=0), cell, axis=1)
    ink = np.zeros((h, w), dtype=bool)
    ink[: mask.shape[0], : mask.shape[1]] = mask
    band = slice(int(0.1 * h), int(0.9 * h))
    image[band] = 0.3 * image[band] + 170  # paper
    image[ink] = rng.uniform(10, 60, 3).astype(np.float32)
    return image


# EXIF orientation -> the transpose that, applied to the upright picture, gives the stored pixels
# (Pillow's ImageOps.exif_transpose applies the inverse when the file is read).
_STORED = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_90",
    7: "TRANSVERSE",
    8: "ROTATE_270",
}


def encode_validation_image(spec: EncodedImageSpec) -> bytes:
    """The file's bytes (Pillow; deterministic for one Pillow build)."""
    import io

    from PIL import Image

    image = Image.fromarray(render_content(spec), "RGB")
    if spec.mode == "L":
        image = image.convert("L")
    elif spec.mode == "RGBA":
        alpha = np.linspace(80, 255, spec.width * spec.height, dtype=np.float32).reshape(spec.height, spec.width)
        image.putalpha(Image.fromarray(alpha.astype(np.uint8), "L"))
    exif = Image.Exif()
    if spec.orientation != 1:
        exif[0x0112] = spec.orientation
    buffer = io.BytesIO()
    if spec.format == "JPEG":
        image.save(buffer, "JPEG", quality=spec.quality, subsampling=spec.subsampling, exif=exif.tobytes())
    else:
        image.save(buffer, "PNG", compress_level=1, exif=exif.tobytes() if spec.orientation != 1 else None)
    return buffer.getvalue()


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
MIN_IMAGE_FILES, MAX_IMAGE_FILES = 8, 1000
MAX_IMAGE_FILE_BYTES = 20 * 1024 * 1024


def read_image_files(directory: str, what: str) -> list[tuple[str, bytes]]:
    """(name, bytes) of the JPEG/PNG/WebP files in `directory` (not recursive), by name; at least
    MIN_IMAGE_FILES, each one an image Pillow can open."""
    from pathlib import Path

    from PIL import Image

    root = Path(directory).expanduser()
    if not root.is_dir():
        raise InvalidSpecError(f"{what}: not a directory: {directory}")
    paths = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not MIN_IMAGE_FILES <= len(paths) <= MAX_IMAGE_FILES:
        raise InvalidSpecError(
            f"{what}: {directory} has {len(paths)} image files ({', '.join(IMAGE_SUFFIXES)}); "
            f"give {MIN_IMAGE_FILES} to {MAX_IMAGE_FILES}"
        )
    files = []
    for path in paths:
        if path.stat().st_size > MAX_IMAGE_FILE_BYTES:
            raise InvalidSpecError(f"{what}: {path} is larger than {MAX_IMAGE_FILE_BYTES // 2**20} MB")
        data = path.read_bytes()
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()
        except Exception as exc:  # noqa: BLE001 - any Pillow failure: the file is not an image
            raise InvalidSpecError(f"{what}: {path} is not a readable image ({type(exc).__name__})") from None
        files.append((path.name, data))
    return files


# The user's calibration photos, packed (`pack_files`), beside an export (not shipped in the bundle)
CALIBRATION_FILE = "calibration.npz"


def pack_files(files: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data): byte strings as two arrays (an npz holds no list of bytes)."""
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)
    return offsets, np.frombuffer(b"".join(files), dtype=np.uint8)


def unpack_files(offsets: np.ndarray, data: np.ndarray) -> list[bytes]:
    blob = data.tobytes()
    return [blob[int(a) : int(b)] for a, b in itertools.pairwise(offsets)]
