"""The image-classification family: a classifier (torchvision, your own module, or a .pt2) with
resize, crop, normalisation and softmax in the graph (exporter:
components/core/exporters/image_classification.py), `images` uint8 `[batch, height, width, 3]` to
`probabilities` float32 `[batch, classes]`.

Gated on max |probability diff|, top-1/top-5 agreement, and the preprocessing's pixels against
torchvision's uint8 pipeline, at batch 1 and batch 8 (same-size groups), and on the served path:
encoded JPEG/PNG files through the server's decoder and the graph, against PyTorch on Pillow's
full decode. The images are the user's photos (`--validation-images`) or generated ones
(components/core/validation_data.py). The reduced JPEG decode the export chose (if any) is
measured too and recorded for the server (kernel/images.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortpack.components.core.exporters.image_models import parse_image_source
from ortpack.components.core.quantization.recipes import STATIC_INT8_RECIPES
from ortpack.components.core.quantization.static_int8 import family_int8
from ortpack.components.core.reference import Reference
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.components.core.validation_data import (
    CALIBRATION_FILE,
    ImageSpec,
    render_image,
    unpack_files,
    validation_images,
)
from ortpack.kernel.contracts.image_classification import CONTRACT, OUTPUT
from ortpack.kernel.engine import as_items
from ortpack.kernel.gates import decisive_rows, gate, probability_metrics, topk_overlap
from ortpack.kernel.images import ImageDecoder
from ortpack.kernel.probe import Probe
from ortpack.kernel.runtime import DISABLED_OPTIMIZERS, SessionPlan, create_session

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec
log = logging.getLogger("ortpack.optimize")

# What a build whose every static int8 recipe missed is told when it was calibrated on generated
# images: a trained classifier's activations on real photos are what the scales must cover
CALIBRATION_HINT = (
    "calibrated on generated images, not photos: static int8 needs real photos of the model's domain "
    "(a few hundred; pass --calibration-images DIR, kept apart from --validation-images)"
)
PROBE_IMAGES = 16
PROBE_REDUCED = 4  # of them, JPEGs the reduced decode scales (when the bundle has one)
PROBE_MAX_BYTES = 600_000

# Images are compared with torchvision's uint8 pipeline, whose resize uses fixed-point
# arithmetic: pixels differ by up to one uint8 level (the graph's own resize: exporters/
# image_classification.py; two for bicubic upscales of tiny images), so even fp32 probabilities
# differ (0.003 measured on MobileNetV3-small). int8 is set from a random-weight MobileNetV3 (no
# trained weights offline; top-1 0.875-0.94, top-5 0.80-0.85 on generated pixels): tighten it for
# trained models.
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(
        GATES, max_abs_diff=0.02, min_top1_agreement=0.95, min_top5_agreement=0.95, max_pixel_diff=2.0
    ),
    "fp16": ParityThresholds.of(
        GATES, max_abs_diff=0.03, min_top1_agreement=0.95, min_top5_agreement=0.95, max_pixel_diff=2.0
    ),
    "int8": ParityThresholds.of(GATES, min_top1_agreement=0.85, min_top5_agreement=0.75, max_pixel_diff=2.0),
}


def resolve_source(value: str) -> tuple[str, str]:

    source = parse_image_source(value)
    return source.value, source.default_name


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.image_classification import export_image_classifier

    return export_image_classifier(spec, out_dir)


def _pixel_diff(images: list[np.ndarray], ref: Any, export_dir: Path) -> dict[str, float]:
    """The exported preprocessing graph's pixels against torchvision's, in uint8 levels."""

    path = export_dir / "preprocess.onnx"
    if not path.is_file():
        return {}
    pre = create_session(
        path, SessionPlan(providers=["CPUExecutionProvider"], online_optimization=True, reason="preprocessing check")
    )
    meta = json.loads((export_dir / "export.json").read_text())["task_settings"]["preprocessing"]
    mean = np.array(meta["mean"]).reshape(3, 1, 1) * 255.0
    std = np.array(meta["std"]).reshape(3, 1, 1) * 255.0
    # the graph's float result rounded to a uint8 level, as torchvision's uint8 kernel outputs
    levels = [np.rint(pre.run(None, {"images": im[None]})[0][0] * std + mean) for im in images]
    diff = np.stack([np.abs(lv - px.astype(np.float64)) for lv, px in zip(levels, ref["pixels"], strict=True)])
    return {"max_pixel_diff": float(diff.max()), "mean_pixel_diff": float(diff.mean())}


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Probabilities at batch 1 (every image) and 8 (same-size groups); top-1/top-5 agreement;
    pixel agreement of the preprocessing with torchvision's; and the served path from the encoded
    files (`served_path`). The gated numbers are the worst of batch 1, batch 8 and the exact
    served path; the reduced decode is recorded for the server to check (kernel/images.py)."""
    images = raw_images(ref)
    expected = ref["outputs"].astype(np.float64)
    single = np.concatenate([session.run(None, {"images": im[None]})[0] for im in images])
    # the set starts with groups of 8 same-size images (validation_images, photo_pixel_set):
    # those run as batches
    grouped = [i for i in range(0, len(images) - 7, 8) if len({im.shape for im in images[i : i + 8]}) == 1]
    batched_rows = {}
    for start in grouped:
        out = session.run(None, {"images": np.stack(images[start : start + 8])})[0]
        for row in range(8):
            batched_rows[start + row] = out[row]
    idx8 = sorted(batched_rows)
    outputs = {1: (np.arange(len(images)), single)}
    if idx8:
        outputs[8] = (np.array(idx8), np.stack([batched_rows[i] for i in idx8]))
    values: dict[str, float] = {}
    for batch, (idx, out) in outputs.items():
        values.update({f"b{batch}.{k}": v for k, v in probability_metrics(expected[idx], out).items()})
    served: dict[str, float] = {}
    if "served_outputs" in ref:
        served = served_path(session, ref, export_dir)
        values.update(served)
    worst = {"max_abs_diff": max, "mean_abs_diff": max, "top1_agreement": min, "top5_agreement": min}
    scopes = [f"b{b}" for b in outputs] + (["served.exact"] if served else [])
    for metric, pick in worst.items():
        values[metric] = pick(values[f"{scope}.{metric}"] for scope in scopes)
    if 8 in outputs:
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
        samples=len(images) + (int(served["served.images"]) if served else 0),
        misses=[f"{nonfinite} outputs contain NaN or inf"] if nonfinite else [],
    )


def raw_images(ref: Any) -> list[np.ndarray]:
    """The raw-pixel validation set: the user's photos (lossless PNGs in the reference), or the
    generated images rendered again from their specs."""

    if "raw_data" in ref:
        return [_decode_png(data) for data in unpack_files(ref["raw_offsets"], ref["raw_data"])]
    specs = zip(ref["heights"], ref["widths"], ref["kinds"], ref["seeds"], strict=True)
    return [render_image(ImageSpec(int(h), int(w), str(k), int(s))) for h, w, k, s in specs]


def _decode_png(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return np.array(image.convert("RGB"))


def calibration_images(export_dir: Path) -> list[np.ndarray]:
    """What static int8 is calibrated on: the user's calibration photos (decoded as the server
    decodes them), else generated images disjoint from the validation set."""

    path = Path(export_dir) / CALIBRATION_FILE
    if not path.is_file():
        return [render_image(spec) for spec in validation_images(calibration=True)]
    decoder = ImageDecoder(max_pixels=1 << 40)
    with np.load(path) as packed:
        return [decoder.decode(data, "calibration image") for data in unpack_files(packed["offsets"], packed["data"])]


def served_path(session: Any, ref: Any, export_dir: Path) -> dict[str, float]:
    """The whole served path on the encoded validation files: the server's decoder
    (kernel/images.py), then the graph at batch 1, against PyTorch on Pillow's full decode.

    `served.exact.*`: exact decoding. When the export chose reduced JPEG decoding as the server's
    default (its `decode_min_side`), also `served.reduced.*` (end to end) and `decode.reduced.*`
    (this variant's outputs with reduced against exact decoding, on the files it reduces: what
    the decode gate, `ortpack.kernel.images.DECODE_GATE`, judges) and `decode.reduced.min_side`."""

    files = ref.served_files()
    expected = ref["served_outputs"].astype(np.float64)
    preprocessing = json.loads((export_dir / "export.json").read_text())["task_settings"]["preprocessing"]
    side = int(preprocessing.get("decode_min_side", 0))

    def run(decoder: ImageDecoder) -> tuple[np.ndarray, list[int]]:
        rows, pixels = [], []
        for data in files:
            image = decoder.decode(data, "validation file")
            pixels.append(image.shape[0] * image.shape[1])
            rows.append(session.run(None, {"images": image[None]})[0][0])
        return np.stack(rows), pixels

    exact, full = run(ImageDecoder(max_pixels=1 << 40))
    values = {"served.images": float(len(files))}
    values.update({f"served.exact.{k}": v for k, v in probability_metrics(expected, exact).items()})
    if side:
        reduced, pixels = run(ImageDecoder(max_pixels=1 << 40, reduce_to=side))
        values.update({f"served.reduced.{k}": v for k, v in probability_metrics(expected, reduced).items()})
        scaled = [i for i, (a, b) in enumerate(zip(pixels, full, strict=True)) if a < b]
        values["decode.reduced.min_side"] = float(side)
        values["decode.reduced.images"] = float(len(scaled))
        if scaled:
            effect = probability_metrics(exact[scaled], reduced[scaled])
            values.update({f"decode.reduced.{k}": v for k, v in effect.items()})
    return values


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    from ortpack.components.core.exporters.image_common import BENCH_SHAPES

    return {
        key: (n, {"images": np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])})
        for key, (n, h, w) in BENCH_SHAPES.items()
    }


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> dict[str, Any]:
    """Static int8 on ONNX Runtime's int8 kernels, judged by the default int8 gate on the
    validation images, with the most sensitive layers returned to float until it passes
    (components/core/quantization/static_int8.py); a pinned `recipe` is built alone (the validate step gates it).
    Returns the recipe, every candidate's numbers and the layers kept in float."""
    images = calibration_images(export_dir)
    thresholds = THRESHOLDS["int8"].as_dict()
    ref = Reference.load(export_dir / export.reference_file)  # read once, not per candidate

    def judge(candidate: Path) -> tuple[dict[str, float], list[str]]:
        values = compare(_session(candidate, DISABLED_OPTIMIZERS), ref, export_dir).values
        quality: dict[str, float] = {
            k: values[k] for k in ("top1_agreement", "top5_agreement", "max_abs_diff") if k in values
        }
        return quality, gate(values, thresholds, GATES)

    result = family_int8(src, dst, images, recipe, judge, lambda q: (q["top1_agreement"], -q["max_abs_diff"]))
    if not result.pop("passed", True) and not (Path(export_dir) / CALIBRATION_FILE).is_file():
        result["hint"] = CALIBRATION_HINT
    return result


def _session(path: Path, disabled: list[str]) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """At most PROBE_IMAGES of the encoded validation files, as clients send them, with PyTorch's
    outputs on their full decode: JPEGs and PNGs of several sizes, EXIF orientations and
    greyscale, decoded identically in both decode modes, plus PROBE_REDUCED JPEGs the bundle's
    reduced decoding scales (when it has one), those it changes least, so that the node check
    runs the decoder the server will use without gating the decode approximation twice (the
    parity gate judged it on the whole set). Small files only: the probe travels in the bundle;
    decisive ones where there are enough."""

    side = int(export.task_settings["preprocessing"].get("decode_min_side", 0))
    ref = Reference.load(export_dir / export.reference_file)
    files = ref.served_files()
    outputs, changed = ref["served_outputs"], ref["served_reduced_diff"]
    formats, short = [str(f) for f in ref["served_formats"]], ref["served_sizes"].min(axis=1)
    small = [i for i, f in enumerate(files) if len(f) <= PROBE_MAX_BYTES]
    # files PyTorch classifies decisively, when there are enough: a node's numbers are checked on
    # what they decide, not on coin flips between two classes (kernel/gates.py DECISIVE_MARGIN)
    decisive = decisive_rows(outputs)
    if sum(1 for i in small if decisive[i]) >= PROBE_IMAGES:
        small = [i for i in small if decisive[i]]
    # libjpeg scales by 1/2 at least, so the reduced decode changes a JPEG whose shorter side is 2 x side or more
    scaled = [i for i in small if side and formats[i] == "JPEG" and short[i] >= 2 * side]
    reduced = sorted(scaled, key=lambda i: float(changed[i]))[:PROBE_REDUCED]
    same = [i for i in small if i not in scaled]
    picked = same[:: max(1, len(same) // (PROBE_IMAGES - len(reduced)))][: PROBE_IMAGES - len(reduced)]
    picked = sorted(picked + reduced)
    return Probe(
        task=export.task, kind="files", inputs=[files[i] for i in picked], outputs=as_items(OUTPUT, outputs[picked])
    )


def _prob_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("max_abs_diff")


FAMILY = TaskFamily(
    name="image-classification",
    description="an image classifier with resize, crop, normalisation and softmax in the graph",
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
