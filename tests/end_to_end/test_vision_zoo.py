"""The vision zoos built by name (slow): one row of each zoo and task through bench/vision_zoo.py's
`build_row`, the pipeline's own steps (export with random weights made non-degenerate, cpu fp32
against the gate, package) and a real server answering a JPEG on the task's route (segmentation:
EfficientNet-Lite0's trained trunk with a fitted per-class head, an own module; a torchvision
segmenter: tests/end_to_end/test_segmentation.py; a one-stage torchvision detector:
tests/end_to_end/test_object_detection.py). The whole
table: `python bench/vision_zoo.py` (docs/vision-zoo.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.vision_zoo import LITE0_OPTIONS, LITE0_SEGMENTER, Row, build_row

SEG = "semantic-segmentation"
FRCNN = "fasterrcnn_mobilenet_v3_large_320_fpn"  # gated on photos (bench/vision_zoo.py)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("row", "answer"),
    [
        (Row("torchvision", "squeezenet1_1", "squeezenet1_1"), "top-1 "),  # not among the five of before
        (Row("timm", "resnet18", "timm:resnet18"), "top-1 "),
        (Row("timm", "convnext_atto", "timm:convnext_atto", task="image-embedding"), "320-d vector"),
        (Row("huggingface", "convnext", ""), "top-1 label_"),
        (Row("torchvision", FRCNN, FRCNN, task="object-detection"), " detections"),  # two stages: RoIAlign
        (Row("huggingface", "conditional_detr", "", task="object-detection"), " detections"),
        (Row("huggingface", "rt_detr", "", task="object-detection"), " detections"),
        (Row("own", "efficientnet_lite0_segmenter", LITE0_SEGMENTER, task=SEG, options=LITE0_OPTIONS), " classes"),
    ],
    ids=lambda value: value.key if isinstance(value, Row) else None,
)
def test_zoo_row_builds_passes_fp32_and_is_served(row: Row, answer: str, tmp_path: Path) -> None:
    record = build_row(row, tmp_path, int8=False)
    assert record["variants"]["fp32"]["passed"], record
    assert record["served"]["status"] == 200 and answer in record["served"]["answer"], record
    assert record["builds"]


def test_timm_model_keeps_its_data_config_in_the_graph(tmp_path: Path) -> None:
    """The exported preprocessing is timm's (bicubic, 235 -> 224 for resnet18's crop_pct 0.95)
    and the manifest records where the model came from."""
    import json

    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec
    from tests.models import make_zoo_weights

    weights = make_zoo_weights("timm:resnet18", tmp_path / "w.pt")
    spec = ExportSpec(
        source="timm:resnet18", task="image-classification", name="r18", options={"weights": str(weights)}
    )
    export_model(spec, tmp_path / "export")
    export = json.loads((tmp_path / "export" / "export.json").read_text())
    pre = export["task_settings"]["preprocessing"]
    assert (pre["resize_size"], pre["crop_size"], pre["interpolation"]) == (235, 224, "bicubic")
    assert export["source"]["kind"] == "timm" and export["source"]["revision"].startswith("timm==")
    assert export["task_settings"]["labels"][0].startswith("tench")
