"""Image classification end to end: preprocessing in the graph, parity with torchvision, the
bundle, and serving raw images (tiny random MobileNetV3 made non-degenerate; nothing downloaded)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from ortpack.components.core.artifacts import ExportResult, ParityReport
from ortpack.components.core.validation_data import ImageSpec, render_image
from ortpack.kernel.bundle import Manifest, verify_bundle
from tests.photos import encode
from tests.request_bodies import BODIES, check_answers
from tests.servers import RunningServer, free_port, running_server

pytestmark = pytest.mark.slow  # builds image bundles (torchvision exports, a served decoder)


@pytest.fixture(scope="session")
def image_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import make_image_weights

    return make_image_weights("mobilenet_v3_small", tmp_path_factory.mktemp("weights") / "mnv3s.safetensors")


@pytest.fixture(scope="session")
def image_export(image_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    out = tmp_path_factory.mktemp("image-export") / "export"
    export_model(
        ExportSpec(
            source="mobilenet_v3_small",
            task="image-classification",
            name="mnv3s",
            options={"weights": str(image_weights)},
        ),
        out,
    )
    return out


@pytest.fixture(scope="session")
def image_variants(image_export: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cpu-fp32 and cpu-int8, each optimized, validated and benchmarked (its own directory)."""
    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    root = tmp_path_factory.mktemp("image-variants")
    dirs = {}
    for precision in ("fp32", "int8"):
        variant = VariantSpec(target="cpu", precision=precision)
        optimize_model(image_export, variant, root / variant.id)
        validate_variant(root / variant.id, image_export, thresholds_for("image-classification", precision))
        benchmark_variant(root / variant.id, image_export, budget_s=0.2)
        dirs[variant.id] = root / variant.id
    return dirs


@pytest.fixture(scope="session")
def image_bundle(image_export: Path, image_variants: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle of the variants that passed (static int8 misses the served-path gate on this
    random-weight model: see test_parity_gates)."""
    from ortpack.components.core.package import package_dirs

    out = tmp_path_factory.mktemp("image-dist") / "mnv3s"
    package_dirs(image_export, list(image_variants.values()), out)
    return out


def reduced_evidence(manifest: Manifest, variant_id: str, side: int) -> Manifest:
    """The manifest as if the parity gate had validated reduced decoding at `side` for the
    variant (numbers within the decode gate): what a bundle of a model whose gate passed says."""
    assert manifest.task_settings.preprocessing is not None
    variant = manifest.variant(variant_id)
    values = {
        **variant.parity.values,
        "decode.reduced.min_side": float(side),
        "decode.reduced.images": 20.0,
        "decode.reduced.top1_agreement": 1.0,
        "decode.reduced.decisive_top1_agreement": 1.0,
        "decode.reduced.top5_agreement": 0.97,
        "decode.reduced.max_abs_diff": 0.05,
        "served.reduced.top1_agreement": 0.99,
        "served.reduced.top5_agreement": 0.97,
    }
    parity = variant.parity.model_copy(update={"values": values})
    variants = [v.model_copy(update={"parity": parity}) if v.id == variant_id else v for v in manifest.variants]
    settings = manifest.task_settings
    preprocessing = settings.preprocessing.model_copy(update={"decode": "reduced", "decode_min_side": side})
    settings = settings.model_copy(update={"preprocessing": preprocessing})
    return manifest.model_copy(update={"variants": variants, "task_settings": settings})


def test_export_signature_and_non_degenerate_reference(image_export: Path) -> None:
    import onnx
    import onnxruntime as ort

    export = ExportResult.load(image_export)
    # ExportSpec.opset is honoured (its default, 17): the preprocessing and the network alike
    assert export.opset == 17
    assert {i.domain: i.version for i in onnx.load(str(image_export / "model.onnx")).opset_import}[""] == 17
    assert export.inputs == [{"name": "images", "dtype": "uint8", "shape": ["batch", "height", "width", 3]}]
    assert export.outputs == [{"name": "probabilities", "dtype": "float32", "shape": ["batch", 1000]}]
    assert (
        export.task_settings["labels"] is not None
        and len(export.task_settings["labels"]) == 1000
        and export.task_settings["labels"][0] == "tench"
    )
    assert (
        export.task_settings["preprocessing"] is not None
        and export.task_settings["preprocessing"]["resize_size"] == 256
    )
    ref = np.load(image_export / "reference.npz")
    probs = ref["outputs"]
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    assert probs.max() > 0.3 and len(set(probs.argmax(1))) > 3, "the test model must not be degenerate"
    session = ort.InferenceSession(str(image_export / "model.onnx"), providers=["CPUExecutionProvider"])
    for h, w in ((17, 23), (1080, 1920), (600, 600)):  # one graph takes every size
        out = session.run(None, {"images": render_image(ImageSpec(h, w, "smooth", 3))[None]})[0]
        assert out.shape == (1, 1000) and abs(float(out.sum()) - 1) < 1e-4


def test_parity_gates(image_bundle: Path, image_variants: dict[str, Path]) -> None:
    manifest = verify_bundle(image_bundle)
    fp32 = manifest.variant("cpu-fp32").parity.values
    int8 = ParityReport.load(image_variants["cpu-int8"])
    assert fp32["max_pixel_diff"] <= 1 and fp32["mean_pixel_diff"] < 0.05  # within 1 level, upscales too
    assert fp32["top1_agreement"] >= 0.95 and fp32["max_abs_diff"] < 0.02
    assert fp32["batch_max_abs_diff"] < 1e-5  # batch 8 rows equal their single runs
    assert {"b1.top5_agreement", "b8.top5_agreement", "served.exact.top5_agreement"} <= set(fp32)
    # static int8 passes the generated pixel images (the gate of the previous validation set) but
    # misses on the encoded photo-like files, so the bundle does not ship it
    assert int8.values["b1.top1_agreement"] >= 0.85 and int8.values["max_abs_diff"] > fp32["max_abs_diff"]
    assert int8.values["served.exact.top1_agreement"] < 0.85 and not int8.passed
    assert [v.id for v in manifest.variants] == ["cpu-fp32"]


def test_gate_covers_the_served_path(image_bundle: Path, image_export: Path, tmp_path: Path) -> None:
    """Every variant is gated on the encoded files through the server's decoder: exact decoding is
    in the gated numbers. The export measured reduced decoding on the PyTorch reference and chose
    the default decode; when it is reduced, the gate also measures each variant with it, at the
    manifest's size, against the reference and against its own exact decode."""
    import shutil

    from ortpack.components.core.parity import check_parity
    from ortpack.components.core.tasks import thresholds_for
    from ortpack.kernel.contracts.image_classification import CONTRACT as IMAGE
    from ortpack.kernel.gates import gate
    from ortpack.kernel.images import DECODE_GATE

    manifest = verify_bundle(image_bundle)
    assert manifest.task_settings.preprocessing is not None
    export = ExportResult.load(image_export)
    assert export.metrics["validation_files"] >= 50
    assert {"decode.x2.top1_agreement", "decode.x2.images"} <= set(export.metrics)
    fp32 = manifest.variant("cpu-fp32").parity.values
    assert fp32["served.images"] == export.metrics["validation_files"]
    assert fp32["top1_agreement"] <= fp32["served.exact.top1_agreement"]  # gated: the worst scope
    assert fp32["max_abs_diff"] >= fp32["served.exact.max_abs_diff"]
    assert ("decode.reduced.min_side" in fp32) == (manifest.task_settings.preprocessing.decode == "reduced")
    # this random-weight model is sensitive to the decode: reduced decoding misses its decode gate
    x2 = {k.removeprefix("decode.x2."): v for k, v in export.metrics.items() if k.startswith("decode.x2.")}
    assert manifest.task_settings.preprocessing.decode == "exact" and gate(x2, DECODE_GATE, IMAGE.gates)

    reduced = tmp_path / "export"  # the same export, had its reduced decoding at 2x passed
    shutil.copytree(image_export, reduced)
    record = json.loads((reduced / "export.json").read_text())
    record["task_settings"]["preprocessing"].update(decode="reduced", decode_min_side=512)
    (reduced / "export.json").write_text(json.dumps(record))
    model = image_bundle / manifest.variant("cpu-fp32").file
    report = check_parity(
        model, reduced / "reference.npz", thresholds_for("image-classification", "fp32"), variant_id="x"
    )
    values = report.values
    assert values["decode.reduced.min_side"] == 512 and values["decode.reduced.images"] >= 8
    for scope in ("served.reduced", "decode.reduced"):
        assert {f"{scope}.top1_agreement", f"{scope}.top5_agreement", f"{scope}.max_abs_diff"} <= set(values)
    assert values["decode.reduced.max_abs_diff"] > 0  # other pixels reach the graph
    assert values["max_abs_diff"] == pytest.approx(fp32["max_abs_diff"], abs=1e-5)  # reduced: not in the worst


def test_server_decoder_is_the_reference_decode(image_export: Path) -> None:
    """Exact decoding gives the reference's pixels on every validation file (EXIF orientations,
    greyscale, alpha, 4:4:4 and 4:2:0 JPEGs): what the served path adds to the graph is nothing."""
    from ortpack.components.core.exporters.image_common import reference_decode
    from ortpack.components.core.validation_data import unpack_files
    from ortpack.kernel.images import ImageDecoder

    with np.load(image_export / "reference.npz") as ref:
        files = unpack_files(ref["served_offsets"], ref["served_data"])
    fast, pillow = ImageDecoder(max_pixels=40_000_000), ImageDecoder(max_pixels=40_000_000)
    assert fast._jpeg is not None, "simplejpeg (the image extra) decodes JPEGs"
    pillow._jpeg = None  # the path without simplejpeg: Pillow decodes everything
    for data in files:
        expected = reference_decode(data)
        np.testing.assert_array_equal(fast.decode(data), expected)
        np.testing.assert_array_equal(pillow.decode(data), expected)


def test_reduced_decoding_is_pillows_at_every_scale(image_export: Path) -> None:
    """The reduced decode by libjpeg-turbo (simplejpeg) gives Pillow's pixels at Pillow's DCT scale
    (the one the gate measured) on every validation file, for reductions to each scale and none."""
    from ortpack.components.core.validation_data import unpack_files
    from ortpack.kernel.images import ImageDecoder

    with np.load(image_export / "reference.npz") as ref:
        files = unpack_files(ref["served_offsets"], ref["served_data"])

    class Scales:  # simplejpeg, counting the decodes not at the size asked (Pillow decodes those again)
        def __init__(self, jpeg: Any) -> None:
            self.jpeg, self.calls, self.missed = jpeg, 0, 0

        def decode_jpeg(self, data: bytes, **options: Any) -> np.ndarray:
            pixels: np.ndarray = self.jpeg.decode_jpeg(data, **options)
            self.calls += 1
            self.missed += pixels.shape[:2] != (options["min_height"], options["min_width"])
            return pixels

    for reduce_to in (32, 100, 224, 256, 384, 512, 4096):
        fast, pillow = ImageDecoder(40_000_000, reduce_to), ImageDecoder(40_000_000, reduce_to)
        fast._jpeg, pillow._jpeg = Scales(fast._jpeg), None
        for data in files:
            np.testing.assert_array_equal(fast.decode(data), pillow.decode(data))
        assert fast._jpeg.calls >= 4 and fast._jpeg.missed == 0, "libjpeg-turbo decoded the JPEGs at Pillow's scale"


def test_decode_mode_needs_the_gates_evidence(image_bundle: Path) -> None:
    """auto serves the reduced decode only when the variant's parity record validates it; an
    explicit reduced request without that evidence refuses the start; exact is always allowed."""
    from ortpack.kernel.images import choose_decoder as choose

    def choose_decoder(manifest: Manifest, variant: Any, requested: str, max_pixels: int) -> Any:
        return choose(manifest.task_settings.preprocessing, variant, requested, max_pixels, manifest.name)

    exact = verify_bundle(image_bundle)
    variant = exact.variant("cpu-fp32")
    assert choose_decoder(exact, variant, "auto", 10**7)[0].reduce_to == 0
    with pytest.raises(ValueError, match="no validated reduced decoding"):
        choose_decoder(exact, variant, "reduced", 10**7)
    manifest = reduced_evidence(exact, "cpu-fp32", 512)
    variant = manifest.variant("cpu-fp32")
    assert choose_decoder(manifest, variant, "auto", 10**7)[0].reduce_to == 512
    assert choose_decoder(manifest, variant, "reduced", 10**7)[0].reduce_to == 512
    assert choose_decoder(manifest, variant, "exact", 10**7)[0].reduce_to == 0

    def changed(**changes: float | None) -> object:
        values = {k: v for k, v in variant.parity.values.items() if changes.get(k, 0) is not None}
        values.update({k: v for k, v in changes.items() if v is not None})
        return variant.model_copy(update={"parity": variant.parity.model_copy(update={"values": values})})

    for bad, reason in (
        (changed(**{"decode.reduced.min_side": None}), "did not measure reduced decoding"),
        (changed(**{"decode.reduced.min_side": 513.0}), "measured reduced decoding at 513 pixels, not 512"),
        (
            changed(**{"decode.reduced.decisive_top1_agreement": 0.99}),
            "against the exact decode: decisive_top1_agreement 0.99",
        ),
        (changed(**{"decode.reduced.max_abs_diff": 0.5}), "against the exact decode: max_abs_diff 0.5"),
        (changed(**{"served.reduced.top1_agreement": 0.5}), "end to end: top1_agreement 0.5"),
    ):
        assert choose_decoder(manifest, bad, "auto", 10**7)[0].reduce_to == 0
        with pytest.raises(ValueError, match=reason):
            choose_decoder(manifest, bad, "reduced", 10**7)
    with pytest.raises(ValueError, match="unknown decode mode"):
        choose_decoder(manifest, variant, "draft", 10**7)


def test_server_refuses_an_unvalidated_decode_at_start(image_bundle: Path) -> None:
    """`ortpack-serve --decode reduced` on a bundle whose gate chose exact decoding exits 2 with
    one line before binding; an unknown mode is a usage error."""
    for args, fragment in (
        (("--decode", "reduced"), "no validated reduced decoding"),
        (("--decode", "draft"), "--decode must be auto, exact or reduced"),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "ortpack.serving", "--bundle", str(image_bundle), "--port", str(free_port()), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, result.stderr
        assert fragment in lines[-1] and "Traceback" not in result.stderr, result.stderr


def test_a_probe_image_that_does_not_decode_is_a_miss_not_a_crash(image_bundle: Path, tmp_path: Path) -> None:
    """The server decodes the probe's images while the session opens; one that does not decode
    still fails the node check with its reason (every candidate tried), not a traceback."""
    import shutil

    from ortpack.kernel.bundle import sha256_file
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.metrics import Metrics
    from ortpack.serving.service import NodeCheckError, load_service

    bundle = tmp_path / "bundle"
    shutil.copytree(image_bundle, bundle)
    rel = "probe/probe.npz"
    with np.load(bundle / rel) as npz:
        arrays = {key: npz[key] for key in npz.files}
    offsets = arrays["offsets"]
    data = arrays["data"].copy()
    data[int(offsets[0]) : int(offsets[1])] = 0  # the first image's bytes zeroed: not a JPEG any more
    np.savez_compressed(bundle / rel, **{**arrays, "data": data})
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][rel] = {"sha256": sha256_file(bundle / rel), "bytes": (bundle / rel).stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    verify_bundle(bundle)
    with pytest.raises(NodeCheckError) as refused:
        load_service(bundle, ServeConfig(bundle=str(bundle), warmup=False), Metrics())
    message = str(refused.value)
    for variant in manifest["variants"]:
        assert f"{variant['id']}: " in message, message
    assert "cannot run the probe" in message and "probe image" in message, message


def test_perturbed_image_graph_misses(image_export: Path, tmp_path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    from ortpack.components.core.parity import check_parity
    from ortpack.components.core.tasks import thresholds_for

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
    from ortpack.components.core.errors import ModelLoadError
    from ortpack.components.core.exporters.image_models import load_image_network, parse_image_source

    def load(name: str, weights: Path) -> object:
        return load_image_network(parse_image_source(name), str(weights), 224)

    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match="cannot read weights from"):
        load("mobilenet_v3_small", tmp_path / "junk.safetensors")
    with pytest.raises(ModelLoadError, match="does not match resnet18: .* missing"):
        load("resnet18", image_weights)  # the wrong architecture
    pickled = tmp_path / "evil.pt"
    torch.save({"x": object()}, pickled)  # needs unpickling arbitrary objects: refused
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        load("mobilenet_v3_small", pickled)


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


def test_classify_json_answers_as_its_schema_says(image_server: RunningServer) -> None:
    """Each body its published schema refuses gets 400, each it accepts an answer valid by the
    answer schema (tests/request_bodies.py)."""
    doc = httpx.get(f"{image_server.url}/openapi.json").json()
    answers = []
    for body, _ in BODIES["/v1/classify/json"]:
        answer = httpx.post(f"{image_server.url}/v1/classify/json", json=body)
        answers.append((body, answer.status_code, answer.json()))
    check_answers(doc, "/v1/classify/json", answers)


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


def test_large_bodies_read_into_their_own_mapping_answer_as_small_ones(
    image_server: RunningServer, image_bundle: Path
) -> None:
    """Bodies of 1 MB or more are read into an anonymous mapping (serving/http.py `read_body`), a
    chunked body of unknown size into a growing buffer: raw PNG bytes, base64 JSON and a chunked
    upload of one noisy photo all answer what the graph gives for its pixels."""
    from ortpack.serving.http import MAPPED_BODY_BYTES

    image = render_image(ImageSpec(900, 1000, "noisy", 7))
    png = encode(image, "PNG")
    assert len(png) > MAPPED_BODY_BYTES
    top = int(np.argmax(direct(image_bundle, image)))
    raw = httpx.post(f"{image_server.url}/v1/classify", content=png, headers={"Content-Type": "image/png"})
    blob = base64.b64encode(png).decode()
    as_json = httpx.post(f"{image_server.url}/v1/classify/json", json={"image": blob}, timeout=60)
    chunked = httpx.post(
        f"{image_server.url}/v1/classify",
        content=(png[i : i + 65536] for i in range(0, len(png), 65536)),  # no Content-Length
        headers={"Content-Type": "image/png"},
    )
    for answer in (raw, as_json, chunked):
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"][0]["index"] == top


def test_a_base64_image_first_in_its_body_is_decoded_from_the_body_as_it_stands(
    image_server: RunningServer, image_bundle: Path
) -> None:
    """`{"image": "<base64>", ...}` is parsed without its string, which is decoded from the body's
    own bytes (serving/http.py `lifted_member`): the answer is the one a body parsed whole gets
    (the image not first), data: URLs included. A lifted string that is not base64, a body
    malformed after it and a repeated key get the answers the whole parse gives."""
    from ortpack.serving.http import LIFT_FROM_BYTES

    image = render_image(ImageSpec(300, 400, "noisy", 3))
    blob = base64.b64encode(encode(image, "PNG")).decode()
    assert len(blob) > LIFT_FROM_BYTES
    expected = [int(i) for i in np.argsort(-direct(image_bundle, image))[:3]]
    url = f"{image_server.url}/v1/classify/json"

    def post(body: str) -> httpx.Response:
        return httpx.post(url, content=body.encode(), headers={"Content-Type": "application/json"}, timeout=30)

    for body in (
        f'{{"image": "{blob}", "top_k": 3}}',  # lifted
        f'{{ "image" :"data:image/png;base64,{blob}","top_k":3}}',  # lifted, a data: URL
        f'{{"top_k": 3, "image": "{blob}"}}',  # parsed whole
    ):
        answer = post(body)
        assert answer.status_code == 200, answer.text
        assert [p["index"] for p in answer.json()["predictions"]] == expected
    for body, fragment in (
        (f'{{"image": "{blob[:5000]}\n{blob[5000:]}"}}', "image is not valid base64"),  # a raw newline
        (f'{{"image": "{blob}"}} x', "malformed JSON: "),
        (f'{{"image": "{blob}", "image": "%%%"}}', "image is not valid base64"),  # the last one counts
    ):
        answer = post(body)
        assert answer.status_code == 400, answer.text
        assert fragment in answer.json()["error"]["message"]


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
    # the binary tensor data extension: the pixels as raw bytes after the JSON, the answer likewise
    tensor = {
        "name": "images",
        "datatype": "UINT8",
        "shape": [2, 40, 50, 3],
        "parameters": {"binary_data_size": images.nbytes},
    }
    head = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    answer = httpx.post(
        f"{image_server.url}/v2/models/mnv3s/infer",
        content=head + images.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
    )
    length = int(answer.headers["Inference-Header-Content-Length"])
    assert json.loads(answer.content[:length])["outputs"][0]["parameters"] == {"binary_data_size": 2 * 1000 * 4}
    rows = np.frombuffer(answer.content[length:], dtype="<f4").reshape(2, 1000)
    np.testing.assert_array_equal(rows, np.array(out["data"], dtype=np.float32).reshape(2, 1000))


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


def test_concurrent_images_of_mixed_sizes(image_server: RunningServer, image_bundle: Path, tmp_path: Path) -> None:
    """On the CPU each image is its own model call by default; with --max-batch-pixels images are
    batched by size, and every answer is its own image's, whatever it was batched with."""
    assert "one per model call" in image_server.output()
    images = [render_image(ImageSpec(*[(120, 160), (160, 120), (99, 99)][i % 3], "smooth", i)) for i in range(30)]
    with running_server(image_bundle, "--max-batch-pixels", "4000000", log_dir=tmp_path) as batching:
        assert "batched by size, at most 4 MP per batch" in batching.output()
        answers = asyncio.run(fire(batching.url, images))
    for answer, image in zip(answers, images, strict=True):
        top = answer.json()["predictions"][0]
        expected = direct(image_bundle, image)
        assert top["index"] == int(np.argmax(expected)) and abs(top["probability"] - float(expected.max())) < 1e-5


def test_pixels_that_do_not_fit_wait_for_those_ahead_and_nothing_is_refused(image_bundle: Path) -> None:
    """Each image's decoded pixels are held from its header before it is decoded; with room for
    about two images' pixels at once, twelve images sent together wait for those ahead of them
    (freed as each is answered) instead of being refused, and everything held is given back."""
    from ortpack.serving.memory import PIXEL_EXPANSION, MemoryBudget
    from tests.fakes import in_process, metric

    images = [render_image(ImageSpec(400, 400, "smooth", i)) for i in range(12)]
    bodies = [encode(im, "PNG") for im in images]
    pixels = int(images[0].nbytes * PIXEL_EXPANSION)

    async def flood() -> tuple[list[int], int, int, float]:
        async with in_process(image_bundle, admission=False) as s:  # the memory budget alone decides
            bodies_held = int(sum(len(b) for b in bodies) * 1.5)  # raw bodies: IMAGE_EXPANSION["raw"]
            s.service.memory = budget = MemoryBudget(bodies_held + 2 * pixels + pixels // 2)
            s.service.metrics.memory_held.set_function(lambda: budget.held)
            answers = await asyncio.gather(
                *(s.client.post("/v1/classify", content=b, headers={"Content-Type": "image/png"}) for b in bodies)
            )
            scraped = metric((await s.client.get("/metrics")).text, "ortpack_memory_held_bytes")
            statuses = [(a.status_code, a.text[:200]) for a in answers]
            # memory nothing will free (other requests' bodies): refused at once, its body given back
            assert budget.reserve(budget.limit - len(bodies[0]) * 2)
            refused = await s.client.post("/v1/classify", content=bodies[0], headers={"Content-Type": "image/png"})
            statuses.append((refused.status_code, refused.json()["error"]["message"]))
            return statuses, budget.held - (budget.limit - len(bodies[0]) * 2), budget.passing, scraped

    statuses, held, passing, scraped = asyncio.run(flood())
    assert [code for code, _ in statuses[:12]] == [200] * 12, statuses
    assert statuses[12][0] == 429 and "decoded pixels" in statuses[12][1]
    assert held == 0 and passing == 0 and scraped == 0.0


async def fire(url: str, images: list[np.ndarray]) -> list[httpx.Response]:
    """Every image posted at once (PNG bytes to /v1/classify)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await asyncio.gather(
            *(
                client.post("/v1/classify?top_k=1", content=encode(im, "PNG"), headers={"Content-Type": "image/png"})
                for im in images
            )
        )


def test_served_decode_modes(image_server: RunningServer, image_bundle: Path, tmp_path: Path) -> None:
    """The server decodes as the bundle's gate validated: this bundle exactly; the same bundle with
    a validated reduced decode (its manifest as the gate would write it) decodes a large JPEG at
    a reduced scale. Each answer is the graph on that decode."""
    import shutil

    from ortpack.kernel.images import ImageDecoder

    copy = tmp_path / "reduced-bundle"
    shutil.copytree(image_bundle, copy)
    from PIL import Image

    from ortpack.kernel.probe import Probe

    # a size at which none of the probe's files is reduced: the node check then passes as before
    probe = Probe.from_bytes((image_bundle / "probe" / "probe.npz").read_bytes())
    side = max(min(Image.open(io.BytesIO(f)).size) for f in probe.inputs) // 2 + 1
    manifest = reduced_evidence(verify_bundle(image_bundle), "cpu-fp32", side)
    (copy / "manifest.json").write_text(manifest.model_dump_json(indent=2))
    jpeg = encode(render_image(ImageSpec(2 * side + 50, 3 * side, "smooth", 9)), "JPEG", quality=90)
    reduced, exact = ImageDecoder(10**8, reduce_to=side).decode(jpeg), ImageDecoder(10**8).decode(jpeg)
    assert min(reduced.shape[:2]) >= side and reduced.shape[0] * 2 <= exact.shape[0] + 1
    with running_server(copy, "--variant", "cpu-fp32", log_dir=tmp_path) as reduced_server:
        assert "decoded reduced" in reduced_server.output()
        for server, pixels in ((image_server, exact), (reduced_server, reduced)):
            answer = httpx.post(
                f"{server.url}/v1/classify?top_k=3", content=jpeg, headers={"Content-Type": "image/jpeg"}
            )
            expected = direct(image_bundle, pixels)
            got = answer.json()["predictions"]
            assert [p["index"] for p in got] == list(np.argsort(-expected)[:3])
            np.testing.assert_allclose([p["probability"] for p in got], np.sort(expected)[::-1][:3], atol=1e-5)
    assert "decoded exact" in image_server.output()


def test_openapi_of_an_image_server(image_server: RunningServer) -> None:
    """The document lists the routes this server registered: classification, not embeddings."""
    paths = httpx.get(f"{image_server.url}/openapi.json").json()["paths"]
    assert {"/v1/classify", "/v1/classify/json", "/v2/models/{name}/infer"} <= set(paths)
    assert "/v1/embeddings" not in paths and "/v1/rerank" not in paths
    assert set(paths["/v1/classify"]["post"]["requestBody"]["content"]) == {"image/jpeg", "image/png", "image/webp"}


def test_int8_runs_on_int8_kernels_with_the_weight_width_this_cpu_sums_exactly(
    image_export: Path, image_variants: dict[str, Path]
) -> None:
    """Static int8's weights are 8-bit only where this CPU sums u8 x s8 products exactly (VNNI,
    AMX: the record says so, and servers on other CPUs skip the variant), 7-bit elsewhere. In the
    session ONNX Runtime builds as a server loads the shipped graph, every convolution outside the
    preprocessing and the recorded fallbacks is an int8 kernel, and no float convolution is fed by
    dequantized weights (quantize/dequantize paid for a float result)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    from ortpack.components.core.artifacts import OptimizeResult
    from ortpack.components.core.quantization.static_int8 import (
        kernel_census,
        quantizable_convolutions,
        weight_bits_here,
    )

    built = OptimizeResult.load(image_variants["cpu-int8"])
    record = built.metrics["int8"]
    assert record["weight_bits"] == weight_bits_here()
    model = onnx.load(str(image_variants["cpu-int8"] / "model.onnx"))
    weights = [
        numpy_helper.to_array(i)
        for i in model.graph.initializer
        if i.data_type == TensorProto.INT8 and len(i.dims) == 4
    ]
    largest = max(int(np.abs(w.astype(np.int64)).max()) for w in weights)
    assert largest <= 64 if record["weight_bits"] == 7 else largest > 64

    census = kernel_census(image_variants["cpu-int8"] / "model.onnx", level=built.online_optimization_level)
    assert census == record["kernels"] and census["dequantized_float"] == []
    convolutions = len(quantizable_convolutions(onnx.load(str(image_export / "model.onnx")).graph))
    kept = len(record["float_layers"])
    assert census["int8"]["QLinearConv"] == convolutions - kept
    assert census["float"].get("Conv", 0) + census["float"].get("FusedConv", 0) == kept
