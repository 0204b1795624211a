"""Image preprocessing, the encoded validation set and the server's decoder, each on its own
(no bundle): the preprocessing graph against torchvision's uint8 kernel, the decoder's limits,
and the bicubic preprocessing of EfficientNet-B0 exported and gated."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from ortpack.components.core.artifacts import ExportResult, ParityReport
from ortpack.components.core.validation_data import ImageSpec, encode_png, render_image

pytestmark = pytest.mark.slow  # torchvision exports


SIZES = [(480, 640), (640, 480), (17, 23), (257, 300), (224, 225), (1080, 1920), (2, 2), (1, 5)]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("opset", [13, 18])
def test_preprocess_graph_matches_torchvision(interpolation: str, opset: int) -> None:
    """The preprocessing graph (ONNX Runtime) against torchvision's uint8 fixed-point kernel: one
    level apart at most when downscaling; upscales (images under the resize size) are reported by
    the gate and stay within two (bicubic on noise)."""
    import onnxruntime as ort

    from ortpack.components.core.exporters.image_common import ImagePreprocess, reference_transform

    pre = {
        "resize_size": 256,
        "crop_size": 224,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "interpolation": interpolation,
    }
    graph = ImagePreprocess(**pre).graph(opset)
    assert graph.opset_import[0].version == opset
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    transform = reference_transform(pre)
    mean, std = np.array(pre["mean"]).reshape(3, 1, 1) * 255, np.array(pre["std"]).reshape(3, 1, 1) * 255
    for i, (h, w) in enumerate(SIZES):
        image = render_image(ImageSpec(h, w, "noisy" if i % 2 else "smooth", i))
        ours = session.run(None, {"images": image[None]})[0][0] * std + mean
        theirs = transform(torch.from_numpy(image).permute(2, 0, 1)).numpy().astype(np.float64)
        assert ours.shape == theirs.shape == (3, 224, 224)
        assert np.abs(np.rint(ours) - theirs).max() <= (1 if min(h, w) >= 256 else 2), (h, w)
    batch = np.stack([render_image(ImageSpec(300, 451, "noisy", i)) for i in range(3)])
    rows = session.run(None, {"images": batch})[0]
    for image, row in zip(batch, rows, strict=True):  # a batch is its images, each on its own
        np.testing.assert_array_equal(row, session.run(None, {"images": image[None]})[0][0])


def test_encoded_validation_set_is_varied_and_deterministic() -> None:
    """The files the served path is gated on: JPEG and PNG, 200x150 to 4000x3000, qualities,
    chroma subsampling, EXIF orientations, greyscale and alpha; the same bytes every time."""
    from PIL import Image

    from ortpack.components.core.validation_data import encode_validation_image, encoded_validation_images

    specs = encoded_validation_images()
    pixels = [s.width * s.height for s in specs]
    assert min(pixels) == 200 * 150 and max(pixels) == 4000 * 3000
    assert {s.format for s in specs} == {"JPEG", "PNG"} and {s.mode for s in specs} == {"RGB", "L", "RGBA"}
    assert {s.content for s in specs} == {"photo", "edges", "text", "fine"}
    assert len({s.orientation for s in specs}) == 8 and len({s.quality for s in specs if s.format == "JPEG"}) >= 4
    assert not {s.seed for s in specs} & {s.seed for s in encoded_validation_images(calibration=True)}
    for spec in (specs[1], specs[-2]):
        data = encode_validation_image(spec)
        assert data == encode_validation_image(spec)
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == spec.format and image.size == (spec.width, spec.height)
            assert image.getexif().get(0x0112, 1) == spec.orientation


def test_preprocessing_spec_of_every_supported_model() -> None:
    from ortpack.components.core.exporters.image_common import preprocessing_spec
    from ortpack.components.core.specs import ExportSpec

    specs = {
        name: preprocessing_spec(ExportSpec(source=name, task="image-classification", name="x"))
        for name in ("mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet50", "efficientnet_b0")
    }
    assert specs["mobilenet_v3_small"]["resize_size"] == 256 and specs["resnet50"]["resize_size"] == 232
    assert specs["efficientnet_b0"]["interpolation"] == "bicubic"
    assert all(s["crop_size"] == 224 for s in specs.values())
    override = preprocessing_spec(
        ExportSpec(
            source="resnet18",
            task="image-classification",
            name="x",
            options={"resize_size": 300, "crop_size": 288, "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)},
        )
    )
    assert (override["resize_size"], override["crop_size"], override["mean"]) == (300, 288, (0.5, 0.5, 0.5))


def test_decoder_keeps_pillows_bomb_check_and_global_state() -> None:
    """Decoding changes nothing process-wide (Pillow's MAX_IMAGE_PIXELS, the warnings filters),
    runs on many threads at once, and Pillow's own decompression-bomb check still answers 413
    when our limit is higher than Pillow's."""
    import struct
    import warnings
    import zlib
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from ortpack.kernel.errors import InputTooLargeError
    from ortpack.kernel.images import ImageDecoder

    pillow_limit, filters = Image.MAX_IMAGE_PIXELS, list(warnings.filters)
    assert pillow_limit is not None
    decoder = ImageDecoder(max_pixels=1 << 40)
    files = [encode_png(render_image(ImageSpec(90 + i, 120, "smooth", i))) for i in range(12)]
    expected = [decoder.decode(f) for f in files]
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            for got, want in zip(pool.map(decoder.decode, files), expected, strict=True):
                np.testing.assert_array_equal(got, want)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    side = int((2 * pillow_limit) ** 0.5) + 10  # a header past twice Pillow's limit: an error at open
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    with pytest.raises(InputTooLargeError, match="too many pixels"):
        decoder.decode(bomb)
    with pytest.raises(InputTooLargeError, match=r"limit 30.0 MP"):
        ImageDecoder(max_pixels=30_000_000).decode(bomb)
    assert Image.MAX_IMAGE_PIXELS == pillow_limit and warnings.filters == filters


def test_decoded_pixels_are_announced_from_the_header_before_decoding() -> None:
    """`reserve` gets the decoded pixels' exact size before any is decoded (full size exact; the DCT
    scale's size reduced), and an error from it stops the decode: a server holds the pixels in its
    memory budget first (serving/service.py `hold_pixels`)."""
    from PIL import Image

    from ortpack.kernel.images import ImageDecoder

    pixels = render_image(ImageSpec(1600, 1200, "smooth", 3))
    jpeg = io.BytesIO()
    Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
    for decoder in (ImageDecoder(1 << 30), ImageDecoder(1 << 30, reduce_to=300)):
        for data in (jpeg.getvalue(), encode_png(pixels)):
            announced: list[int] = []
            decoded = decoder.decode(data, "x", announced.append)
            assert announced == [decoded.nbytes], (decoder.mode, announced, decoded.shape)

    reduced = ImageDecoder(1 << 30, reduce_to=300).decode(jpeg.getvalue())
    assert reduced.shape == (400, 300, 3)  # a quarter of 1600x1200: what was announced is the reduced size

    class NoRoom(Exception):
        pass

    def refuse(nbytes: int) -> None:
        raise NoRoom(nbytes)

    with pytest.raises(NoRoom):
        ImageDecoder(1 << 30).decode(jpeg.getvalue(), "x", refuse)


@pytest.mark.slow
def test_efficientnet_bicubic_export_passes_its_gate(tmp_path: Path) -> None:
    """The bicubic preprocessing of EfficientNet-B0's weights, exported and gated like the rest."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for
    from tests.models import make_image_weights

    weights = make_image_weights("efficientnet_b0", tmp_path / "b0.safetensors")
    export_model(
        ExportSpec(source="efficientnet_b0", task="image-classification", name="b0", options={"weights": str(weights)}),
        tmp_path / "export",
    )
    optimize_model(tmp_path / "export", VariantSpec(target="cpu", precision="fp32"), tmp_path / "fp32")
    report = validate_variant(tmp_path / "fp32", tmp_path / "export", thresholds_for("image-classification", "fp32"))
    assert ExportResult.load(tmp_path / "export").task_settings["preprocessing"]["interpolation"] == "bicubic"
    assert report.passed, report.misses
    assert ParityReport.load(tmp_path / "fp32").values["max_pixel_diff"] <= 2
