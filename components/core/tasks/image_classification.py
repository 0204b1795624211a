"""The image-classification family: a torchvision classifier with resize, crop, normalisation and
softmax in the graph (exporter: components/core/exporters/image_classification.py), `images`
uint8 `[batch, height, width, 3]` to `probabilities` float32 `[batch, classes]`.

Gated on max |probability diff|, top-1/top-5 agreement, and the preprocessing's pixels against
torchvision's uint8 pipeline, at batch 1 and batch 8 (same-size groups).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.core.specs import ParityThresholds
from components.core.tasks import Comparison, ReportSpec, TaskFamily
from serving.gates import topk_overlap

if TYPE_CHECKING:
    from components.core.artifacts import ExportResult
    from components.core.specs import ExportSpec
    from serving.probe import Probe

PROBE_IMAGES = 16

# Images are compared with torchvision's uint8 pipeline, whose resize uses fixed-point
# arithmetic: pixels differ by up to one uint8 level when downscaling, and by up to two when an
# image is upscaled (smaller than the resize size: ORT's antialiased Resize then differs from
# torch's, which matches torchvision exactly), so even fp32 probabilities differ (0.0097
# measured on MobileNetV3-small). int8 is set from a random-weight MobileNetV3 (no trained
# weights offline; top-1 0.875-0.94, top-5 0.80-0.85): tighten it for trained models.
THRESHOLDS = {
    "fp32": ParityThresholds(max_abs_diff=0.02, min_top1_agreement=0.95, min_top5_agreement=0.95, max_pixel_diff=2.0),
    "fp16": ParityThresholds(max_abs_diff=0.03, min_top1_agreement=0.95, min_top5_agreement=0.95, max_pixel_diff=2.0),
    "int8": ParityThresholds(min_top1_agreement=0.85, min_top5_agreement=0.75, max_pixel_diff=2.0),
}


def resolve_source(value: str) -> tuple[str, str]:
    from components.core.errors import ModelLoadError
    from components.core.sources import TORCHVISION_MODELS

    if value not in TORCHVISION_MODELS:
        raise ModelLoadError(f"unknown image model {value!r} (supported: {', '.join(TORCHVISION_MODELS)})")
    return value, value


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from components.core.exporters.image_classification import export_image_classifier

    return export_image_classifier(spec, out_dir)


def check_signature(session: Any) -> list[str]:
    misses = []
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or inputs[0].name != "images" or inputs[0].type != "tensor(uint8)":
        misses.append(f"inputs are {[(i.name, i.type) for i in inputs]}, expected images uint8")
    elif len(inputs[0].shape) != 4 or inputs[0].shape[3] != 3 or any(isinstance(d, int) for d in inputs[0].shape[:3]):
        misses.append(f"input images has shape {inputs[0].shape}, expected [batch, height, width, 3]")
    if len(outputs) != 1 or outputs[0].name != "probabilities" or outputs[0].type != "tensor(float)":
        misses.append(f"outputs are {[(o.name, o.type) for o in outputs]}, expected probabilities float32")
    return misses


def _pixel_diff(images: list[np.ndarray], ref: Any, export_dir: Path) -> dict[str, float]:
    """The exported preprocessing graph's pixels against torchvision's, in uint8 levels."""
    from serving.runtime import SessionPlan, create_session

    path = export_dir / "preprocess.onnx"
    if not path.is_file():
        return {}
    pre = create_session(
        path, SessionPlan(providers=["CPUExecutionProvider"], online_optimization=True, reason="preprocessing check")
    )
    meta = json.loads((export_dir / "export.json").read_text())["preprocessing"]
    mean = np.array(meta["mean"]).reshape(3, 1, 1) * 255.0
    std = np.array(meta["std"]).reshape(3, 1, 1) * 255.0
    # the graph's float result rounded to a uint8 level, as torchvision's uint8 kernel outputs
    levels = [np.rint(pre.run(None, {"images": im[None]})[0][0] * std + mean) for im in images]
    diff = np.stack([np.abs(lv - px.astype(np.float64)) for lv, px in zip(levels, ref["pixels"], strict=True)])
    return {"max_pixel_diff": float(diff.max()), "mean_pixel_diff": float(diff.mean())}


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Probabilities at batch 1 (every image) and 8 (same-size groups); top-1/top-5 agreement;
    pixel agreement of the preprocessing with torchvision's."""
    from components.core.validation_data import ImageSpec, render_image

    specs = [
        ImageSpec(int(h), int(w), str(k), int(s))
        for h, w, k, s in zip(ref["heights"], ref["widths"], ref["kinds"], ref["seeds"], strict=True)
    ]
    images = [render_image(spec) for spec in specs]
    expected = ref["outputs"].astype(np.float64)
    single = np.concatenate([session.run(None, {"images": im[None]})[0] for im in images])
    # the set starts with groups of 8 same-size images (validation_images): those run as batches
    grouped = [i for i in range(0, len(specs) - 7, 8) if len({(s.height, s.width) for s in specs[i : i + 8]}) == 1]
    batched_rows = {}
    for start in grouped:
        out = session.run(None, {"images": np.stack(images[start : start + 8])})[0]
        for row in range(8):
            batched_rows[start + row] = out[row]
    idx8 = sorted(batched_rows)
    outputs = {1: (np.arange(len(specs)), single), 8: (np.array(idx8), np.stack([batched_rows[i] for i in idx8]))}
    values: dict[str, float] = {}
    for batch, (idx, out) in outputs.items():
        diff = np.abs(out.astype(np.float64) - expected[idx])
        values[f"b{batch}.max_abs_diff"] = float(diff.max())
        values[f"b{batch}.mean_abs_diff"] = float(diff.mean())
        values[f"b{batch}.top1_agreement"] = float(np.mean(out.argmax(1) == expected[idx].argmax(1)))
        values[f"b{batch}.top5_agreement"] = float(topk_overlap(expected[idx], out, 5).mean())
    worst = {"max_abs_diff": max, "mean_abs_diff": max, "top1_agreement": min, "top5_agreement": min}
    for metric, pick in worst.items():
        values[metric] = pick(values[f"b{b}.{metric}"] for b in outputs)
    values["batch_max_abs_diff"] = float(np.abs(outputs[8][1] - single[outputs[8][0]]).max())
    nonfinite = int((~np.isfinite(single)).any(axis=1).sum())
    values["nonfinite_rows"] = float(nonfinite)
    values.update(_pixel_diff(images, ref, export_dir))
    return Comparison(
        values=values,
        per_item={
            "prob_diff": [float(d) for d in np.abs(single - expected).max(axis=1)],
            "top5_overlap": [float(o) for o in topk_overlap(expected, single, 5)],
        },
        samples=len(specs),
        misses=[f"{nonfinite} outputs contain NaN or inf"] if nonfinite else [],
    )


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    from components.core.exporters.image_classification import BENCH_SHAPES
    from components.core.validation_data import ImageSpec, render_image

    return {
        key: (n, {"images": np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])})
        for key, (n, h, w) in BENCH_SHAPES.items()
    }


def quantize_int8(src: Path, dst: Path) -> None:
    from components.core.optimize import quantize_int8_static

    quantize_int8_static(src, dst)


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """Smooth (photo-like) validation images of several sizes, at most PROBE_IMAGES, as PNG: PNG is
    lossless, so the server's decoder yields exactly the pixels the reference was computed on."""
    from components.core.validation_data import ImageSpec, encode_png, render_image
    from serving.probe import Probe

    with np.load(export_dir / export.reference_file, allow_pickle=False) as ref:
        specs = [
            ImageSpec(int(h), int(w), str(k), int(s))
            for h, w, k, s in zip(ref["heights"], ref["widths"], ref["kinds"], ref["seeds"], strict=True)
        ]
        picked = [i for i, s in enumerate(specs) if s.kind == "smooth" and s.height * s.width <= 1_300_000]
        picked = picked[:: max(1, len(picked) // PROBE_IMAGES)][:PROBE_IMAGES]
        return Probe(
            task=export.task,
            inputs=[encode_png(render_image(specs[i])) for i in picked],
            outputs=ref["outputs"][picked],
        )


def _prob_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("max_abs_diff")


FAMILY = TaskFamily(
    name="image-classification",
    description="a torchvision classifier with resize, crop, normalisation and softmax in the graph",
    options=frozenset({"weights", "labels", "resize_size", "crop_size", "mean", "std"}),
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    check_signature=check_signature,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=quantize_int8,
    select_probe=select_probe,
    report=ReportSpec(
        columns=(
            ("max|diff|", "max_abs_diff", ".2g"),
            ("top-1", "top1_agreement", ".3f"),
            ("top-5", "top5_agreement", ".3f"),
            ("pixels", "max_pixel_diff", ".3g"),
        ),
        distance=("prob_diff", "largest probability difference to PyTorch, per image", _prob_gate),
        agreement=("top5_overlap", 5, "share of images by how many of PyTorch's top-5 classes the variant keeps"),
        unit="images",
    ),
)
