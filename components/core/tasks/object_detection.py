"""The object-detection family: a detector (torchvision's builders, or your own module with a
declared decoder) with its preprocessing, box decoding and NMS in the graph (exporter:
components/core/exporters/object_detection.py), `images` uint8 `[batch, height, width, 3]` to each
image's detections.

Gated on what is served: the validation files decoded by the server's decoder, each run at batch
1 (and, for graphs that take batches, four same-size crops as one batch), the variant's
detections matched to PyTorch's per image (same label, IoU >= 0.5; kernel/engines/object_detection.py):
matched recall and precision, the same over decisive detections (well above the score
threshold), the smallest IoU of a matched pair, the largest corner difference of matched boxes in
pixels, the largest score difference, the largest difference in an image's count. The worst of
batch 1 and the batch is gated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortpack.components.core.quantization.int8_search import session
from ortpack.components.core.quantization.recipes import STATIC_INT8_RECIPES
from ortpack.components.core.quantization.static_int8 import family_int8
from ortpack.components.core.reference import Reference, calibration_photos
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.components.core.validation_data import ImageSpec, render_image
from ortpack.kernel.contracts.object_detection import BATCH_INDEX, BOXES, CONTRACT, LABELS, SCORES
from ortpack.kernel.engine import Item
from ortpack.kernel.engines.object_detection import detection_metrics, match, split
from ortpack.kernel.gates import gate
from ortpack.kernel.images import ImageDecoder
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec


OUTPUTS = (BOXES, SCORES, LABELS, BATCH_INDEX)
PROBE_IMAGES = 12
PROBE_MAX_BYTES = 600_000

# fp32 must find PyTorch's every detection, boxes within a pixel and scores within 1e-3 (float noise
# is ~1e-3 px). fp16 and int8 move scores, so detections near the score threshold come and go: they
# are gated on the decisive detections (DECISIVE_MARGIN above the threshold, found both ways) and on
# how matched boxes overlap (IoU: the same at any image size, where a pixel gate is not). int8 on
# the trained YOLOv8s (24 photos, 9 decisive detections, Xeon with AMX): decisive recall 1.0,
# precision 0.91, matched IoU >= 0.82, scores within 0.09 (docs/object-detection.md).
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(
        GATES,
        min_matched_recall=1.0,
        min_matched_precision=1.0,
        max_box_diff_px=1.0,
        max_score_diff=1e-3,
        max_count_diff=0.0,
    ),
    "fp16": ParityThresholds.of(
        GATES, min_decisive_recall=0.97, min_decisive_precision=0.97, min_matched_iou=0.95, max_score_diff=0.03
    ),
    "int8": ParityThresholds.of(
        GATES, min_decisive_recall=0.9, min_decisive_precision=0.9, min_matched_iou=0.8, max_score_diff=0.15
    ),
}


def resolve_source(value: str) -> tuple[str, str]:
    from ortpack.components.core.exporters.object_detection import parse_detection_source

    source = parse_detection_source(value)
    return source.value, source.default_name


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.object_detection import export_object_detector

    return export_object_detector(spec, out_dir)


def detections(ref: Reference | dict[str, Any], prefix: str) -> list[Item]:
    """The reference's per-image detections written by the exporter (`<prefix>_ends`, ...)."""
    ends = ref[f"{prefix}_ends"]
    items = []
    for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        items.append(
            {
                BOXES: ref[f"{prefix}_boxes"][start:end],
                SCORES: ref[f"{prefix}_scores"][start:end],
                LABELS: ref[f"{prefix}_labels"][start:end],
                BATCH_INDEX: np.full(int(end - start), i, dtype=np.int64),
            }
        )
    return items


def _run(session: Any, images: list[np.ndarray], max_detections: int) -> list[Item]:
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, {"images": np.stack(images)}), strict=True))
    return split(out, len(images), max_detections)


def _settings(export_dir: Path) -> dict[str, Any]:
    settings: dict[str, Any] = json.loads((Path(export_dir) / "export.json").read_text())["task_settings"]
    return settings


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """The served path (each file decoded by the server's decoder, batch 1) and, where the graph
    takes batches, four same-size crops as one batch; the worst of the two is gated."""
    thresholds = _settings(export_dir)["thresholds"]
    top, floor = int(thresholds["max_detections"]), float(thresholds["score"])
    decoder = ImageDecoder(max_pixels=1 << 40)
    files = ref.served_files()
    expected = detections(ref, "served")
    got = [_run(session, [decoder.decode(f, "validation file")], top)[0] for f in files]
    scopes = {"served": detection_metrics(expected, got, floor)}
    if "batch_ends" in ref:
        crops = list(ref["batch_images"])
        batched = _run(session, crops, top)
        scopes["batch"] = detection_metrics(detections(ref, "batch"), batched, floor)
        alone = [_run(session, [crop], top)[0] for crop in crops]
        scopes["batch_vs_single"] = detection_metrics(alone, batched, floor)
    values: dict[str, float] = {}
    for scope, numbers in scopes.items():
        values.update({f"{scope}.{k}": v for k, v in numbers.items()})
    gated = [s for s in ("served", "batch") if s in scopes]
    for metric, pick in (
        ("matched_recall", min),
        ("matched_precision", min),
        ("matched_f1", min),
        ("decisive_recall", min),
        ("decisive_precision", min),
        ("min_matched_iou", min),
        ("max_box_diff_px", max),
        ("max_score_diff", max),
        ("max_count_diff", max),
    ):
        values[metric] = pick(scopes[s][metric] for s in gated)
    values["detections"] = scopes["served"]["detections"]
    values["decisive_detections"] = scopes["served"]["decisive_detections"]
    nonfinite = sum(not np.isfinite(item[BOXES]).all() or not np.isfinite(item[SCORES]).all() for item in got)
    values["nonfinite_rows"] = float(nonfinite)
    return Comparison(
        values=values,
        per_item={
            "box_diff": [_largest_box_diff(e, g) for e, g in zip(expected, got, strict=True)],
            "recall": [detection_metrics([e], [g])["matched_recall"] for e, g in zip(expected, got, strict=True)],
        },
        samples=len(files) + (len(ref["batch_images"]) if "batch_ends" in ref else 0),
        misses=[f"{nonfinite} images' detections contain NaN or inf"] if nonfinite else [],
    )


def _largest_box_diff(reference: Item, candidate: Item) -> float:
    pairs = match(reference, candidate)
    return max((float(np.abs(reference[BOXES][r] - candidate[BOXES][c]).max()) for r, c in pairs), default=0.0)


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    from ortpack.components.core.exporters.object_detection import BENCH_SHAPES

    return {
        key: (n, {"images": np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])})
        for key, (n, h, w) in BENCH_SHAPES.items()
    }


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> dict[str, Any]:
    """Static int8 of the convolutions on ONNX Runtime's int8 kernels (the letterbox, box decoding
    and NMS blocks, `pre/` and `post/`, stay fp32; so does what torchvision computes outside
    convolutions), calibrated on photos, judged by the int8 matching gate, the most sensitive
    layers returned to float until it passes (components/core/quantization/static_int8.py; else the best
    matched F1 is kept). A pinned `recipe` is built alone."""
    images = calibration_photos(export_dir)
    ref = Reference.load(export_dir / export.reference_file)

    def judge(candidate: Path) -> tuple[dict[str, float], list[str]]:
        values = compare(session(candidate), ref, export_dir).values
        quality = {k: values[k] for k in ("decisive_recall", "decisive_precision", "matched_f1", "min_matched_iou")}
        return quality, gate(values, THRESHOLDS["int8"].as_dict(), GATES)

    result = family_int8(src, dst, images, recipe, judge, lambda q: q["matched_f1"])
    result.pop("passed", None)
    return result


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """Up to 12 small validation files, those PyTorch finds something in first, with its detections."""
    ref = Reference.load(export_dir / export.reference_file)
    files = ref.served_files()
    items = detections(ref, "served")
    small = [i for i, f in enumerate(files) if len(f) <= PROBE_MAX_BYTES] or list(range(len(files)))
    found = [i for i in small if len(items[i][SCORES])]
    picked = sorted((found + [i for i in small if i not in found])[:PROBE_IMAGES])
    outputs = [{**items[i], BATCH_INDEX: np.zeros(len(items[i][SCORES]), dtype=np.int64)} for i in picked]
    return Probe(task=export.task, kind="files", inputs=[files[i] for i in picked], outputs=outputs, varying=OUTPUTS)


def _box_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("max_box_diff_px")


FAMILY = TaskFamily(
    name="object-detection",
    description="an object detector with its resize or letterbox, box decoding and NMS in the graph",
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=quantize_int8,
    int8_recipes=tuple(STATIC_INT8_RECIPES),
    select_probe=select_probe,
    report=ReportSpec(
        columns=(
            ("recall", "matched_recall", ".3f"),
            ("decisive recall", "decisive_recall", ".3f"),
            ("decisive precision", "decisive_precision", ".3f"),
            ("box IoU", "min_matched_iou", ".3f"),
            ("score", "max_score_diff", ".2g"),
        ),
        distance=("box_diff", "largest corner difference of matched boxes to PyTorch, px, per image", _box_gate),
        agreement=("recall", 1, "share of images by whether the variant finds all of PyTorch's detections"),
        unit="images",
    ),
)
