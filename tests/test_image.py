"""Image classification end to end: preprocessing in the graph, parity with torchvision, the
bundle, and serving raw images (tiny random MobileNetV3 made non-degenerate; nothing downloaded)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from components.core.artifacts import ExportResult, ParityReport
from components.core.validation_data import ImageSpec, render_image
from serving.bundle import verify_bundle
from tests.servers import RunningServer, running_server


@pytest.fixture(scope="session")
def image_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_image_weights

    return make_image_weights("mobilenet_v3_small", tmp_path_factory.mktemp("weights") / "mnv3s.safetensors")


@pytest.fixture(scope="session")
def image_export(image_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from components.core.export import export_model
    from components.core.specs import ExportSpec

    out = tmp_path_factory.mktemp("image-export") / "export"
    export_model(
        ExportSpec(source="mobilenet_v3_small", task="image-classification", name="mnv3s", weights=str(image_weights)),
        out,
    )
    return out


@pytest.fixture(scope="session")
def image_bundle(image_export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from components.core.benchmark import benchmark_variant
    from components.core.optimize import optimize_model
    from components.core.package import package_dirs
    from components.core.parity import validate_variant
    from components.core.specs import VariantSpec, thresholds_for

    root = tmp_path_factory.mktemp("image-variants")
    dirs = []
    for precision in ("fp32", "int8"):
        variant = VariantSpec(target="cpu", precision=precision)
        optimize_model(image_export, variant, root / variant.id)
        validate_variant(root / variant.id, image_export, thresholds_for("image-classification", precision))
        benchmark_variant(root / variant.id, image_export, budget_s=0.2)
        dirs.append(root / variant.id)
    out = tmp_path_factory.mktemp("image-dist") / "mnv3s"
    package_dirs(image_export, dirs, out)
    return out


SIZES = [(480, 640), (640, 480), (17, 23), (257, 300), (224, 225), (1080, 1920)]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_preprocess_module_matches_torchvision_within_one_level(interpolation: str) -> None:
    """Float resizing against torchvision's uint8 fixed-point kernel: at most one level apart."""
    from components.core.exporters.image_classification import ImagePreprocess, reference_transform

    pre = {
        "resize_size": 256,
        "crop_size": 224,
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "interpolation": interpolation,
    }
    module = ImagePreprocess(**pre).eval()
    transform = reference_transform(pre)
    mean, std = np.array(pre["mean"]).reshape(3, 1, 1) * 255, np.array(pre["std"]).reshape(3, 1, 1) * 255
    for i, (h, w) in enumerate(SIZES):
        image = render_image(ImageSpec(h, w, "noisy" if i % 2 else "smooth", i))
        with torch.inference_mode():
            ours = module(torch.from_numpy(image)[None]).numpy()[0] * std + mean
        theirs = transform(torch.from_numpy(image).permute(2, 0, 1)).numpy().astype(np.float64)
        assert ours.shape == theirs.shape == (3, 224, 224)
        assert np.abs(np.rint(ours) - theirs).max() <= 1, (h, w)


def test_preprocessing_spec_of_every_supported_model() -> None:
    from components.core.exporters.image_classification import preprocessing_spec
    from components.core.sources import TORCHVISION_MODELS
    from components.core.specs import ExportSpec

    specs = {
        name: preprocessing_spec(ExportSpec(source=name, task="image-classification", name="x"))
        for name in TORCHVISION_MODELS
    }
    assert specs["mobilenet_v3_small"]["resize_size"] == 256 and specs["resnet50"]["resize_size"] == 232
    assert specs["efficientnet_b0"]["interpolation"] == "bicubic"
    assert all(s["crop_size"] == 224 for s in specs.values())
    override = preprocessing_spec(
        ExportSpec(
            source="resnet18",
            task="image-classification",
            name="x",
            resize_size=300,
            crop_size=288,
            mean=(0.5, 0.5, 0.5),
            std=(0.25, 0.25, 0.25),
        )
    )
    assert (override["resize_size"], override["crop_size"], override["mean"]) == (300, 288, (0.5, 0.5, 0.5))


def test_export_signature_and_non_degenerate_reference(image_export: Path) -> None:
    import onnxruntime as ort

    export = ExportResult.load(image_export)
    assert export.inputs == [{"name": "images", "dtype": "uint8", "shape": ["batch", "height", "width", 3]}]
    assert export.outputs == [{"name": "probabilities", "dtype": "float32", "shape": ["batch", 1000]}]
    assert export.labels is not None and len(export.labels) == 1000 and export.labels[0] == "tench"
    assert export.preprocessing is not None and export.preprocessing["resize_size"] == 256
    ref = np.load(image_export / "reference.npz")
    probs = ref["outputs"]
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert probs.max() > 0.3 and len(set(probs.argmax(1))) > 3, "the test model must not be degenerate"
    session = ort.InferenceSession(str(image_export / "model.onnx"), providers=["CPUExecutionProvider"])
    for h, w in ((17, 23), (1080, 1920), (600, 600)):  # one graph takes every size
        out = session.run(None, {"images": render_image(ImageSpec(h, w, "smooth", 3))[None]})[0]
        assert out.shape == (1, 1000) and abs(float(out.sum()) - 1) < 1e-4


def test_parity_gates(image_bundle: Path, image_export: Path) -> None:
    manifest = verify_bundle(image_bundle)
    fp32 = manifest.variant("cpu-fp32").parity.values
    int8 = manifest.variant("cpu-int8").parity.values
    # within 1 level downscaling, 2 upscaling (224x224 images: ORT's antialiased Resize differs)
    assert fp32["max_pixel_diff"] <= 2 and fp32["mean_pixel_diff"] < 0.05
    assert fp32["top1_agreement"] >= 0.95 and fp32["max_abs_diff"] < 0.02
    assert int8["top1_agreement"] >= 0.85 and int8["max_abs_diff"] > fp32["max_abs_diff"]  # int8 is lossy
    assert fp32["batch_max_abs_diff"] < 1e-5  # batch 8 rows equal their single runs
    assert {"b1.top5_agreement", "b8.top5_agreement"} <= set(fp32)


def test_perturbed_image_graph_misses(image_export: Path, tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from components.core.parity import check_parity
    from components.core.specs import thresholds_for

    model = onnx.load(str(image_export / "model.onnx"))
    net = [t for t in model.graph.initializer if t.name.startswith("net/") and len(t.dims) == 4]
    weight = max(net, key=lambda t: np.prod(t.dims))
    array = numpy_helper.to_array(weight) * 1.5
    weight.CopyFrom(numpy_helper.from_array(array.astype(np.float32), weight.name))
    onnx.save(model, str(tmp_path / "bad.onnx"))
    report = check_parity(
        tmp_path / "bad.onnx",
        image_export / "reference.npz",
        thresholds_for("image-classification", "fp32"),
        variant_id="bad",
    )
    assert not report.passed and report.values["max_pixel_diff"] <= 2  # the network, not the pixels, drifted


def test_bad_weights_are_one_line_errors(tmp_path: Path, image_weights: Path) -> None:
    from components.core.errors import ModelLoadError
    from components.core.exporters.image_classification import load_network

    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match="cannot load weights from"):
        load_network("mobilenet_v3_small", str(tmp_path / "junk.safetensors"))
    with pytest.raises(ModelLoadError, match="into resnet18"):
        load_network("resnet18", str(image_weights))  # the wrong architecture
    pickled = tmp_path / "evil.pt"
    torch.save({"x": object()}, pickled)  # needs unpickling arbitrary objects: refused
    with pytest.raises(ModelLoadError, match="cannot load weights"):
        load_network("mobilenet_v3_small", str(pickled))


# ------------------------------------------------------------------ serving


@pytest.fixture(scope="module")
def image_server(image_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        image_bundle,
        "--variant",
        "cpu-fp32",
        "--max-image-pixels",
        "30000000",
        "--max-body-bytes",
        "8000000",
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as server:
        yield server


def encode(image: np.ndarray, fmt: str, **options: object) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, fmt, **options)
    return buf.getvalue()


def direct(bundle: Path, image: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(bundle / "variants" / "cpu-fp32" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"images": image[None]})[0][0]


def test_classify_raw_png_webp_and_jpeg(image_server: RunningServer, image_bundle: Path) -> None:
    image = render_image(ImageSpec(300, 451, "smooth", 5))
    expected = direct(image_bundle, image)
    for fmt, kind in (("PNG", "image/png"), ("WEBP", "image/webp")):  # lossless: the exact pixels
        options = {"lossless": True} if fmt == "WEBP" else {}
        answer = httpx.post(
            f"{image_server.url}/v1/classify?top_k=3",
            content=encode(image, fmt, **options),
            headers={"Content-Type": kind},
        )
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["predictions"]
        assert [p["index"] for p in predictions] == list(np.argsort(-expected)[:3])
        np.testing.assert_allclose([p["probability"] for p in predictions], np.sort(expected)[::-1][:3], atol=1e-5)
    jpeg = httpx.post(
        f"{image_server.url}/v1/classify",
        content=encode(image, "JPEG", quality=95),
        headers={"Content-Type": "image/jpeg"},
    ).json()
    assert len(jpeg["predictions"]) == 5 and jpeg["predictions"][0]["label"]


def test_classify_base64_json_and_batches(image_server: RunningServer, image_bundle: Path) -> None:
    images = [render_image(ImageSpec(h, w, "smooth", i)) for i, (h, w) in enumerate([(200, 300), (200, 300), (90, 60)])]
    blobs = [base64.b64encode(encode(im, "PNG")).decode() for im in images]
    one = httpx.post(f"{image_server.url}/v1/classify/json", json={"image": f"data:image/png;base64,{blobs[0]}"}).json()
    many = httpx.post(f"{image_server.url}/v1/classify/json", json={"images": blobs, "top_k": 1}).json()
    assert one["predictions"][0]["index"] == int(np.argmax(direct(image_bundle, images[0])))
    assert [d["index"] for d in many["data"]] == [0, 1, 2]
    for d, im in zip(many["data"], images, strict=True):
        assert d["predictions"][0]["index"] == int(np.argmax(direct(image_bundle, im)))
        assert abs(d["predictions"][0]["probability"] - float(direct(image_bundle, im).max())) < 1e-5


def test_open_inference_protocol_uint8(image_server: RunningServer, image_bundle: Path) -> None:
    meta = httpx.get(f"{image_server.url}/v2/models/mnv3s").json()
    assert meta["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}]
    images = np.stack([render_image(ImageSpec(40, 50, "noisy", i)) for i in range(2)])
    body = {
        "inputs": [
            {"name": "images", "datatype": "UINT8", "shape": [2, 40, 50, 3], "data": images.reshape(-1).tolist()}
        ]
    }
    out = httpx.post(f"{image_server.url}/v2/models/mnv3s/infer", json=body).json()["outputs"][0]
    assert out["name"] == "probabilities" and out["shape"] == [2, 1000]
    np.testing.assert_allclose(np.array(out["data"]).reshape(2, 1000)[1], direct(image_bundle, images[1]), atol=1e-5)


def _bomb() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (8000, 8000)).save(buf, "PNG")  # 64 megapixels in ~70 KB
    return buf.getvalue()


def _gif() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (10, 10)).save(buf, "GIF")
    return buf.getvalue()


JPEG = encode(render_image(ImageSpec(100, 100, "smooth", 1)), "JPEG")
BAD_IMAGES = [
    ("/v1/classify", b"this is text", "image/jpeg", 400, "not an image"),
    ("/v1/classify", JPEG[: len(JPEG) // 2], "image/jpeg", 400, "truncated or corrupt"),
    ("/v1/classify", b"", "image/png", 400, "is empty"),
    ("/v1/classify", _bomb(), "image/png", 413, "8000x8000 (64.0 megapixels); the limit is 30.0"),
    ("/v1/classify", _gif(), "image/gif", 415, "is GIF; send JPEG, PNG or WebP"),
    ("/v1/classify", JPEG, "text/plain", 415, "Content-Type image/*"),
    ("/v1/classify?top_k=0", JPEG, "image/jpeg", 400, "top_k must be"),
    (
        "/v1/classify/json",
        json.dumps({"image": "%%%not base64%%%"}).encode(),
        "application/json",
        400,
        "image is not valid base64",
    ),
    (
        "/v1/classify/json",
        json.dumps({"images": ["aGVsbG8="]}).encode(),
        "application/json",
        400,
        "images[0] is not an image",
    ),
    (
        "/v1/classify/json",
        json.dumps({"picture": "x"}).encode(),
        "application/json",
        400,
        "'image' (base64) or 'images'",
    ),
    ("/v1/classify/json", json.dumps({"image": 7}).encode(), "application/json", 400, "must be a base64 string"),
    (
        "/v2/models/mnv3s/infer",
        json.dumps(
            {"inputs": [{"name": "images", "datatype": "FP32", "shape": [1, 2, 2, 3], "data": [0] * 12}]}
        ).encode(),
        "application/json",
        400,
        "datatype UINT8",
    ),
    (
        "/v2/models/mnv3s/infer",
        json.dumps({"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 2, 2], "data": [0] * 4}]}).encode(),
        "application/json",
        400,
        "shape must be [n, height, width, 3]",
    ),
    (
        "/v2/models/mnv3s/infer",
        json.dumps(
            {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 3], "data": [0] * 11}]}
        ).encode(),
        "application/json",
        400,
        "but 11 elements",
    ),
    (
        "/v2/models/mnv3s/infer",
        json.dumps(
            {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 2, 2, 3], "data": [300] * 12}]}
        ).encode(),
        "application/json",
        400,
        "integers 0..255",
    ),
    (
        "/v2/models/mnv3s/infer",
        json.dumps(
            {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 100000, 100000, 3], "data": []}]}
        ).encode(),
        "application/json",
        413,
        "pixel limit",
    ),
    ("/v1/embeddings", json.dumps({"input": "x"}).encode(), "application/json", 404, "no route"),
]


@pytest.mark.parametrize(
    ("path", "body", "kind", "status", "fragment"), BAD_IMAGES, ids=[f"{b[0]}-{b[3]}-{b[4][:24]}" for b in BAD_IMAGES]
)
def test_bad_images_get_4xx_in_one_shape(
    image_server: RunningServer, path: str, body: bytes, kind: str, status: int, fragment: str
) -> None:
    answer = httpx.post(f"{image_server.url}{path}", content=body, headers={"Content-Type": kind}, timeout=30)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "code"} and fragment in error["message"]


def test_concurrent_images_of_mixed_sizes(image_server: RunningServer, image_bundle: Path) -> None:
    """Images are batched by size; every answer is its own image's, whatever it was batched with."""
    import asyncio

    images = [render_image(ImageSpec(*[(120, 160), (160, 120), (99, 99)][i % 3], "smooth", i)) for i in range(30)]

    async def fire() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=image_server.url, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        "/v1/classify?top_k=1", content=encode(im, "PNG"), headers={"Content-Type": "image/png"}
                    )
                    for im in images
                )
            )

    for answer, image in zip(asyncio.run(fire()), images, strict=True):
        top = answer.json()["predictions"][0]
        expected = direct(image_bundle, image)
        assert top["index"] == int(np.argmax(expected)) and abs(top["probability"] - float(expected.max())) < 1e-5


def test_jpeg_draft_decoding(image_bundle: Path, tmp_path: Path) -> None:
    """--jpeg-draft decodes large JPEGs at a reduced scale: close to, not equal to, the full decode."""
    jpeg = encode(render_image(ImageSpec(1200, 1600, "smooth", 9)), "JPEG", quality=90)
    answers = {}
    for flag in ("false", "true"):
        with running_server(image_bundle, "--variant", "cpu-fp32", "--jpeg-draft", flag, log_dir=tmp_path) as server:
            answer = httpx.post(
                f"{server.url}/v1/classify?top_k=5", content=jpeg, headers={"Content-Type": "image/jpeg"}
            )
            answers[flag] = {p["index"]: p["probability"] for p in answer.json()["predictions"]}
    assert answers["false"] != answers["true"]  # different pixels reach the graph
    assert len(set(answers["false"]) & set(answers["true"])) >= 3


@pytest.mark.slow
def test_efficientnet_bicubic_export_passes_its_gate(tmp_path: Path) -> None:
    """The bicubic preprocessing of EfficientNet-B0's weights, exported and gated like the rest."""
    from components.core.export import export_model
    from components.core.optimize import optimize_model
    from components.core.parity import validate_variant
    from components.core.specs import ExportSpec, VariantSpec, thresholds_for
    from tests.models import make_image_weights

    weights = make_image_weights("efficientnet_b0", tmp_path / "b0.safetensors")
    export_model(
        ExportSpec(source="efficientnet_b0", task="image-classification", name="b0", weights=str(weights)),
        tmp_path / "export",
    )
    optimize_model(tmp_path / "export", VariantSpec(target="cpu", precision="fp32"), tmp_path / "fp32")
    report = validate_variant(tmp_path / "fp32", tmp_path / "export", thresholds_for("image-classification", "fp32"))
    assert ExportResult.load(tmp_path / "export").preprocessing["interpolation"] == "bicubic"  # type: ignore[index]
    assert report.passed, report.misses
    assert ParityReport.load(tmp_path / "fp32").values["max_pixel_diff"] <= 2


def test_int8_variant_has_7_bit_weights(image_bundle: Path) -> None:
    """Static int8 uses 7-bit weights too: the same numbers on CPUs with and without VNNI."""
    from tests.test_hardware import int8_weight_magnitude

    assert int8_weight_magnitude(image_bundle / "variants" / "cpu-int8" / "model.onnx") <= 64
