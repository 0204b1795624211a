"""The semantic-segmentation family: a segmenter (torchvision's builders, a Hugging Face
checkpoint, or your own module) with its resize, normalisation, the logits resized back to the
image and the per-pixel argmax in the graph (exporter:
components/core/exporters/semantic_segmentation.py), `images` uint8 `[batch, height, width, 3]` to
`label_map` uint8 `[batch, height, width]`.

Gated on what is served: the validation files decoded by the server's decoder, each run at batch
1, and four same-size crops of the largest as one batch, each map compared with PyTorch's pixel by
pixel (kernel/engines/semantic_segmentation.py): the share of pixels that agree (all, the worst
image's, and PyTorch's decisive ones) and the mean IoU of the classes present. The worst of
batch 1 and the batch is gated.
"""

from __future__ import annotations

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
from ortpack.kernel.contracts.semantic_segmentation import CONTRACT, OUTPUT
from ortpack.kernel.engine import Item
from ortpack.kernel.engines.semantic_segmentation import DECISIVE, segmentation_metrics
from ortpack.kernel.gates import gate
from ortpack.kernel.images import ImageDecoder
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec


PROBE_IMAGES = 8
PROBE_MAX_BYTES = 300_000

# fp32: the graph resizes within one uint8 level of torchvision's kernel, so pixels on a boundary
# between two classes (nearly equal logits) may flip; the bar is 99 % of pixels, and every
# pixel PyTorch classifies decisively. Measured on a trained trunk (EfficientNet-Lite0 with a fitted
# per-class head, 53 generated files): pixels 0.995, worst image 0.986, decisive 1.000, mean IoU
# 0.957 (a class of a few pixels moves the mean: 0.9). fp16 and int8 move logits further:
# boundaries move, decisive pixels must hold.
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(
        GATES,
        min_pixel_agreement=0.99,
        min_min_image_agreement=0.97,
        min_mean_iou=0.9,
        min_decisive_pixel_agreement=0.999,
    ),
    "fp16": ParityThresholds.of(
        GATES,
        min_pixel_agreement=0.98,
        min_min_image_agreement=0.9,
        min_mean_iou=0.85,
        min_decisive_pixel_agreement=0.99,
    ),
    "int8": ParityThresholds.of(
        GATES,
        min_pixel_agreement=0.95,
        min_min_image_agreement=0.8,
        min_mean_iou=0.75,
        min_decisive_pixel_agreement=0.97,
    ),
}


def resolve_source(value: str) -> tuple[str, str]:
    from ortpack.components.core.exporters.semantic_segmentation import parse_segmentation_source

    source = parse_segmentation_source(value)
    return source.value, source.default_name


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.semantic_segmentation import export_segmenter

    return export_segmenter(spec, out_dir)


def maps(ref: Reference | dict[str, Any], prefix: str) -> list[Item]:
    """The reference's per-image maps and decisive masks (flat) written by the exporter."""
    ends = ref[f"{prefix}_ends"]
    flat, decisive = ref[f"{prefix}_maps"], ref[f"{prefix}_decisive"]
    return [
        {OUTPUT: flat[start:end], DECISIVE: decisive[start:end]}
        for start, end in zip([0, *ends[:-1]], ends, strict=True)
    ]


def _run(session: Any, images: list[np.ndarray]) -> list[Item]:
    out = session.run(None, {"images": np.stack(images)})[0]
    return [{OUTPUT: row} for row in out]


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """The served path (each file decoded by the server's decoder, batch 1) and four same-size
    crops of the largest as one batch; the worst of the two is gated."""
    decoder = ImageDecoder(max_pixels=1 << 40)
    files = ref.served_files()
    expected = maps(ref, "served")
    got = [_run(session, [decoder.decode(f, "validation file")])[0] for f in files]
    scopes = {"served": segmentation_metrics(expected, got)}
    if "batch_ends" in ref:
        crops = list(ref["batch_images"])
        batched = _run(session, crops)
        scopes["batch"] = segmentation_metrics(maps(ref, "batch"), batched)
        alone = [_run(session, [crop])[0] for crop in crops]
        scopes["batch_vs_single"] = segmentation_metrics(alone, batched)
    values: dict[str, float] = {}
    for scope, numbers in scopes.items():
        values.update({f"{scope}.{k}": v for k, v in numbers.items()})
    gated = [s for s in ("served", "batch") if s in scopes]
    for metric in ("pixel_agreement", "min_image_agreement", "mean_iou", "decisive_pixel_agreement"):
        present = [scopes[s][metric] for s in gated if metric in scopes[s]]
        if present:
            values[metric] = min(present)
    for metric in ("classes_present", "pixels", "decisive_pixels"):
        if metric in scopes["served"]:
            values[metric] = scopes["served"][metric]
    return Comparison(
        values=values,
        per_item={
            "disagreement": [
                1.0 - segmentation_metrics([e], [g])["pixel_agreement"] for e, g in zip(expected, got, strict=True)
            ],
            "pixel_agreement": [
                segmentation_metrics([e], [g])["pixel_agreement"] for e, g in zip(expected, got, strict=True)
            ],
        },
        samples=len(files) + (len(ref["batch_images"]) if "batch_ends" in ref else 0),
    )


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    from ortpack.components.core.exporters.semantic_segmentation import BENCH_SHAPES

    return {
        key: (n, {"images": np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])})
        for key, (n, h, w) in BENCH_SHAPES.items()
    }


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> dict[str, Any]:
    """Static int8 of the network on ONNX Runtime's int8 kernels (the resize, the map's resize and
    argmax, `pre/` and `post/`, stay fp32), calibrated on photos, judged by the int8 gate, the most
    sensitive layers returned to float until it passes (components/core/quantization/static_int8.py; else the
    best pixel agreement is kept). A pinned `recipe` is built alone."""
    images = calibration_photos(export_dir)
    ref = Reference.load(export_dir / export.reference_file)

    def judge(candidate: Path) -> tuple[dict[str, float], list[str]]:
        values = compare(session(candidate), ref, export_dir).values
        names = ("pixel_agreement", "decisive_pixel_agreement", "mean_iou")
        quality: dict[str, float] = {k: values[k] for k in names if k in values}
        return quality, gate(values, THRESHOLDS["int8"].as_dict(), GATES)

    result = family_int8(src, dst, images, recipe, judge, lambda q: q["pixel_agreement"])
    result.pop("passed", None)
    return result


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """Up to 8 small validation files, those whose reference maps hold the most classes first,
    with PyTorch's maps and decisive masks (flat)."""
    ref = Reference.load(export_dir / export.reference_file)
    files = ref.served_files()
    items = maps(ref, "served")
    small = [i for i, f in enumerate(files) if len(f) <= PROBE_MAX_BYTES] or list(range(len(files)))
    small.sort(key=lambda i: (-len(np.unique(items[i][OUTPUT])), len(files[i])))
    picked = sorted(small[:PROBE_IMAGES])
    return Probe(
        task=export.task,
        kind="files",
        inputs=[files[i] for i in picked],
        outputs=[items[i] for i in picked],
        varying=(OUTPUT, DECISIVE),
    )


def _disagreement_gate(thresholds: dict[str, float]) -> float | None:
    worst = thresholds.get("min_min_image_agreement")
    return None if worst is None else 1.0 - worst


FAMILY = TaskFamily(
    name="semantic-segmentation",
    description="a semantic segmenter with its resize, the map at the image's size and the argmax in the graph",
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
            ("pixels", "pixel_agreement", ".4f"),
            ("worst image", "min_image_agreement", ".4f"),
            ("decisive", "decisive_pixel_agreement", ".4f"),
            ("mean IoU", "mean_iou", ".3f"),
        ),
        distance=("disagreement", "share of pixels whose class differs from PyTorch's, per image", _disagreement_gate),
        agreement=("pixel_agreement", 100, "share of images by the percentage of pixels with PyTorch's class"),
        unit="images",
    ),
)
