"""Object detection's parts on a tiny seeded detector in YOLOv8's output form (tests/own_models.py):
the letterbox, decoding and NMS built as ONNX graphs against the same steps in PyTorch, the
exporter's errors, and the matching every gate and probe reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ortpack.components.core.validation_data import ImageSpec, render_image
from ortpack.kernel.engines.object_detection import detection_metrics, iou, match, split

MODEL = "tests.own_models:tiny_yolo"
OPTIONS = {"decoder": "yolo", "input_size": 128, "score_threshold": 0.3}


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    out = tmp_path_factory.mktemp("detect") / "export"
    export_model(ExportSpec(source=MODEL, task="object-detection", name="tiny", options=OPTIONS), out)
    return out


def session(path: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run(sess: Any, images: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, {"images": np.stack(images)}), strict=True))
    return split(out, len(images), 300)


def reference() -> Any:
    from ortpack.components.core.exporters.detection_graphs import YoloReference
    from tests.own_models import tiny_yolo

    return YoloReference(tiny_yolo().eval(), 128, 114, 0.3, 0.45, 100)


@pytest.mark.parametrize("shape", [(17, 23), (480, 640), (641, 300), (128, 128)])
def test_letterbox_graph_is_the_reference_letterbox(shape: tuple[int, int]) -> None:
    """Scaled to fit keeping the aspect, padded with 114 in the middle (the odd pixel at the
    bottom and right), in [0, 1]: the graph's pixels are PyTorch's within float rounding."""
    import onnxruntime as ort

    from ortpack.components.core.exporters.detection_graphs import letterbox_graph

    image = render_image(ImageSpec(*shape, "smooth", 4))
    sess = ort.InferenceSession(letterbox_graph(128, 114, 17).SerializeToString(), providers=["CPUExecutionProvider"])
    pixels, geometry = sess.run(None, {"images": image[None]})
    expected, (scale, top, left) = reference().letterbox(image)
    assert pixels.shape == (1, 3, 128, 128)
    np.testing.assert_allclose(pixels, expected.numpy(), atol=1e-5)
    np.testing.assert_allclose(geometry, [scale, top, left, shape[0], shape[1]], rtol=1e-6)


def test_exported_graph_finds_what_pytorch_finds(tiny_export: Path) -> None:
    """The whole graph (letterbox, network, NMS, boxes back in the image's pixels) against PyTorch
    on images of several sizes: the same detections, boxes within a thousandth of a pixel; a
    batch of same-size images gives each image's own detections."""
    from ortpack.components.core.artifacts import ExportResult

    export = ExportResult.load(tiny_export)
    assert export.task_settings["labels"] == ["round", "square"]  # the module's `names`
    assert export.task_settings["preprocessing"]["mode"] == "letterbox" and export.model_info["classes"] == 2
    assert [o["name"] for o in export.outputs] == ["boxes", "scores", "labels", "batch_index"]
    sess, ref = session(tiny_export / "model.onnx"), reference()
    images = [
        render_image(ImageSpec(h, w, "smooth", i)) for i, (h, w) in enumerate([(97, 211), (480, 640), (300, 300)])
    ]
    expected = [ref(im) for im in images]
    got = [run(sess, [im])[0] for im in images]
    assert sum(len(e["scores"]) for e in expected) >= 3, "the tiny detector must find something"
    metrics = detection_metrics(expected, got)
    assert metrics["matched_recall"] == metrics["matched_precision"] == 1.0
    assert metrics["max_box_diff_px"] < 1e-2 and metrics["max_score_diff"] < 1e-5
    for item, image in zip(got, images, strict=True):  # inside the image
        h, w = image.shape[:2]
        assert (
            (item["boxes"] >= 0).all()
            and (item["boxes"][:, [0, 2]] <= w).all()
            and (item["boxes"][:, [1, 3]] <= h).all()
        )
    same = [render_image(ImageSpec(200, 260, "smooth", i)) for i in range(3)]
    batched = run(sess, same)
    assert detection_metrics([run(sess, [im])[0] for im in same], batched)["matched_f1"] == 1.0
    assert [int(b["batch_index"].max(initial=i)) for i, b in enumerate(batched)] == [0, 1, 2]


def test_the_fp32_gate_passes_and_records_the_batch(tiny_export: Path, tmp_path: Path) -> None:
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    variant = VariantSpec(target="cpu", precision="fp32")
    optimize_model(tiny_export, variant, tmp_path / variant.id)
    report = validate_variant(tmp_path / variant.id, tiny_export, thresholds_for("object-detection", "fp32"))
    assert report.passed, report.misses
    assert report.values["matched_recall"] == 1.0 and report.values["batch.images"] == 4
    assert report.values["served.detections"] == report.values["detections"] > 0


@pytest.mark.parametrize(
    ("model", "options", "fragment"),
    [
        (MODEL, {}, "decoder=yolo"),
        ("tests.own_models:tiny_net", {"decoder": "yolo"}, "raw head outputs"),
        ("SSDLite320_MobileNet_V3_Large", {}, "did you mean 'ssdlite320_mobilenet_v3_large'"),
        (MODEL, {"decoder": "yolo", "input_size": 128, "labels": "missing.txt"}, "labels file not found"),
    ],
)
def test_export_errors_are_one_line(model: str, options: dict[str, Any], fragment: str, tmp_path: Path) -> None:
    from ortpack.components.core.errors import OrtpackError
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    with pytest.raises(OrtpackError) as caught:
        export_model(ExportSpec(source=model, task="object-detection", name="x", options=options), tmp_path / "x")
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def item(boxes: list[list[float]], scores: list[float], labels: list[int]) -> dict[str, np.ndarray]:
    return {
        "boxes": np.array(boxes, dtype=np.float32).reshape(-1, 4),
        "scores": np.array(scores, dtype=np.float32),
        "labels": np.array(labels, dtype=np.int64),
    }


def test_matching_pairs_same_label_overlapping_detections() -> None:
    ref = item([[0, 0, 10, 10], [20, 20, 40, 40]], [0.9, 0.8], [0, 1])
    assert match(ref, ref) == [(0, 0), (1, 1)]
    moved = item([[1, 0, 11, 10], [20, 20, 40, 40]], [0.85, 0.8], [0, 0])  # the second: another label
    assert match(ref, moved) == [(0, 0)]
    metrics = detection_metrics([ref], [moved])
    assert metrics["matched_recall"] == metrics["matched_precision"] == 0.5
    assert metrics["max_box_diff_px"] == 1.0 and metrics["max_score_diff"] == pytest.approx(0.05)
    # below IoU 0.5 is another detection; two candidates never take one reference detection
    assert match(ref, item([[5, 5, 15, 15]], [0.9], [0])) == []
    assert len(match(ref, item([[0, 0, 10, 10], [0, 0, 10, 10]], [0.9, 0.8], [0, 0]))) == 1
    empty = item([], [], [])
    assert detection_metrics([empty], [empty])["matched_f1"] == 1.0
    assert detection_metrics([ref], [empty])["matched_recall"] == 0.0
    np.testing.assert_allclose(iou(ref["boxes"], ref["boxes"]), np.eye(2))
    line = item([[0, 5, 0, 9]], [0.5], [0])  # clipped to the image's left edge: no area
    assert match(line, line) == [(0, 0)] and match(line, item([[0, 5, 3, 9]], [0.5], [0])) == []


def test_split_orders_each_image_best_first_and_caps_it() -> None:
    out = {
        "boxes": np.arange(20, dtype=np.float32).reshape(5, 4),
        "scores": np.array([0.3, 0.9, 0.5, 0.7, 0.6], dtype=np.float32),
        "labels": np.array([0, 1, 0, 1, 0]),
        "batch_index": np.array([0, 0, 2, 0, 2]),
    }
    first, second, third = split(out, 3, 2)
    assert first["scores"].tolist() == pytest.approx([0.9, 0.7]) and len(second["scores"]) == 0
    assert third["scores"].tolist() == pytest.approx([0.6, 0.5]) and third["batch_index"].tolist() == [2, 2]
