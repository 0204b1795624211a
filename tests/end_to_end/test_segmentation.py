"""Semantic segmentation end to end (slow): a tiny random SegFormer checkpoint directory (its head
fitted so that maps hold several classes: tests/models.py), built by the normal build (the map at
the photo's size in the graph, gated on the encoded validation files), packaged and served by a
real server: `/v1/segment` (raw bytes; PNG, run-length and class-list answers; `Accept:
image/png`), `/v1/segment/json` and the Open Inference Protocol give the same map, at the photo's
own size; bad requests get the JSON error shape."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.photos import encode, source_image
from tests.servers import running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def segformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(bundle, build result): the fp32 variant of a tiny SegFormer through the normal build."""
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from tests.models import make_hf_segmenter

    root = tmp_path_factory.mktemp("segformer")
    checkpoint = make_hf_segmenter("segformer", root)
    spec = BuildSpec(
        export=ExportSpec(source=str(checkpoint), task="semantic-segmentation", name="segformer"),
        variants=tuple(variant_grid(["cpu"], ["fp32"])),
    )
    return root / "dist", build_bundle(spec, root / "dist", work_dir=root / "work")


def test_the_map_passes_the_fp32_gate(segformer: tuple[Path, Any]) -> None:
    from ortpack.kernel.bundle import verify_bundle

    bundle, result = segformer
    manifest = verify_bundle(bundle)
    settings = manifest.task_settings
    assert (settings.preprocessing.resize, settings.preprocessing.size) == ("fixed", 128)
    assert settings.labels == [f"region_{i}" for i in range(6)]
    assert not result.export.degenerate_reference and result.export.metrics["reference_classes_present"] >= 4
    values = manifest.variant("cpu-fp32").parity.values
    assert values["pixel_agreement"] >= 0.99 and values["decisive_pixel_agreement"] >= 0.999
    assert values["batch.pixel_agreement"] >= 0.99  # four same-size crops as one batch
    assert values["batch_vs_single.pixel_agreement"] == 1.0


def _png_map(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        assert image.mode == "L"
        return np.array(image)


def test_served_maps_agree_across_routes_and_forms(segformer: tuple[Path, Any], tmp_path: Path) -> None:
    photo = np.ascontiguousarray(source_image("coffee")[:300, :410])  # 410 x 300: not the model's square
    jpeg = encode(photo, "JPEG", quality=92)
    headers = {"content-type": "image/jpeg"}
    with running_server(segformer[0], "--no-warmup", log_dir=tmp_path) as server:
        answer = httpx.post(server.url + "/v1/segment", content=jpeg, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["width"], body["height"]) == (410, 300)
        label_map = _png_map(base64.b64decode(body["label_map"]))
        assert label_map.shape == (300, 410)
        counts = np.bincount(label_map.reshape(-1), minlength=6)
        assert {c["index"]: c["pixels"] for c in body["classes"]} == {i: int(n) for i, n in enumerate(counts) if n}
        assert all(c["label"] == f"region_{c['index']}" for c in body["classes"])

        png = httpx.post(server.url + "/v1/segment", content=jpeg, headers={**headers, "accept": "image/png"})
        assert png.headers["content-type"] == "image/png"
        np.testing.assert_array_equal(_png_map(png.content), label_map)

        rle = httpx.post(server.url + "/v1/segment?format=rle", content=jpeg, headers=headers).json()
        rebuilt = np.zeros(300 * 410, dtype=np.int64) - 1
        for mask in rle["masks"]:
            assert mask["rle"]["size"] == [300, 410]
            runs = np.concatenate([np.full(n, i % 2, dtype=bool) for i, n in enumerate(mask["rle"]["counts"])])
            rebuilt[runs] = mask["index"]  # column-major pixels
        np.testing.assert_array_equal(rebuilt.reshape(410, 300).T, label_map)

        b64 = base64.b64encode(jpeg).decode()
        several = httpx.post(
            server.url + "/v1/segment/json", json={"images": [b64, b64], "format": "classes"}, timeout=60
        ).json()
        assert [d["index"] for d in several["data"]] == [0, 1]
        assert several["data"][0]["classes"] == body["classes"] and "label_map" not in several["data"][0]

        decoded = np.array(__import__("PIL.Image").Image.open(io.BytesIO(jpeg)).convert("RGB"))
        v2 = httpx.post(
            server.url + "/v2/models/segformer/infer",
            json={
                "inputs": [
                    {
                        "name": "images",
                        "datatype": "UINT8",
                        "shape": [1, 300, 410, 3],
                        "data": decoded.reshape(-1).tolist(),
                    }
                ]
            },
            timeout=60,
        ).json()
        (output,) = v2["outputs"]
        assert output["name"] == "label_map" and output["datatype"] == "UINT8" and output["shape"] == [1, 300, 410]
        np.testing.assert_array_equal(np.array(output["data"], dtype=np.uint8).reshape(300, 410), label_map)

        for request, says in (
            (dict(url="/v1/segment?format=svg", content=jpeg, headers=headers), "format must be one of"),
            (dict(url="/v1/segment", content=b"not an image", headers=headers), "image"),
            (dict(url="/v1/segment/json", json={"image": b64, "format": 3}), "format"),
        ):
            url = server.url + str(request.pop("url"))
            refused = httpx.post(url, timeout=60, **request)  # type: ignore[arg-type]
            assert refused.status_code == 400, refused.text
            assert says in refused.json()["error"]["message"]


def test_a_torchvision_builder_by_name_passes_fp32_on_photos(tmp_path: Path) -> None:
    """LR-ASPP by its builder's name, on low-pass random weights (tests.models: a white-noise
    trunk flips pixels on a one-level input change), its shorter side at 128 px instead of 520
    (quicker; the graph takes every aspect), validated on photos: the fp32 gate passes and
    the manifest holds the weights' VOC categories."""
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from ortpack.components.core.validation_data import MIN_IMAGE_FILES
    from ortpack.kernel.bundle import verify_bundle
    from tests.models import make_segmentation_weights

    weights = make_segmentation_weights("lraspp_mobilenet_v3_large", tmp_path / "lraspp.pt", side=128)
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(MIN_IMAGE_FILES):
        name = ("astronaut", "coffee", "chelsea", "rocket")[i % 4]
        image = source_image(name)[i * 7 :, i * 5 :]  # other sizes and aspects
        (photos / f"{i:02d}-{name}.jpg").write_bytes(encode(np.ascontiguousarray(image), "JPEG"))
    options = {"weights": str(weights), "resize_size": 128, "validation_images": str(photos)}
    spec = BuildSpec(
        export=ExportSpec(
            source="lraspp_mobilenet_v3_large", task="semantic-segmentation", name="lraspp", options=options
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32"])),
    )
    build_bundle(spec, tmp_path / "dist", work_dir=tmp_path / "work")
    manifest = verify_bundle(tmp_path / "dist")
    settings = manifest.task_settings
    assert (settings.preprocessing.resize, settings.preprocessing.size) == ("shorter", 128)
    assert settings.labels[0] == "__background__" and len(settings.labels) == 21
    values = manifest.variant("cpu-fp32").parity.values
    assert values["pixel_agreement"] >= 0.99 and values["classes_present"] >= 4
