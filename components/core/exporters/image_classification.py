"""Export an image classifier with its preprocessing and softmax in the graph.

Input: a torchvision model name, your own module (`PACKAGE.MODULE:FACTORY`) or a `torch.export`
program (`FILE.pt2`) (components/core/exporters/image_models.py), weights from a local
state-dict file (safetensors, or a torch file read with `weights_only=True`) or random
initialisation, an optional labels file (one label per line; default: a torchvision model's
ImageNet categories), and optionally your own photos: `validation_images` (a directory the parity
gate runs, through the server's decoder) and `calibration_images` (a directory static int8 is
calibrated on, kept apart from the validation photos). Without them, generated images are used.

Output graph: `images` uint8 `[batch, height, width, 3]` (RGB, any size; all images of a batch
share one size) to `probabilities` float32 `[batch, classes]`. Inside: resize of the shorter side
(antialiased, bilinear or bicubic as the weights' transforms say), centre crop, scale to [0, 1],
normalise, the model, softmax. The preprocessing graph, the validation set and the reference
decode are what every image task shares (image_common.py); this module adds the classifier's
head (softmax), its labels and the choice of the server's default JPEG decode.

What this does not do: detection or segmentation heads, models that take more than one tensor.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, InvalidSpecError
from ortpack.components.core.exporters.image_common import (
    INPUT_NAME,
    MIN_OPSET,
    ValidationSet,
    export_graphs,
    generated_validation_set,
    photo_validation_set,
    preprocessing_settings,
    preprocessing_spec,
    read_labels_file,
    reference_decode,
    reference_decode_size,
    reference_transform,
    torch_latency,
)
from ortpack.components.core.exporters.image_models import (
    default_labels,
    load_image_network,
    parse_image_source,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.validation_data import (
    CALIBRATION_FILE,
    pack_files,
    read_image_files,
)
from ortpack.kernel.contracts.image_classification import CONTRACT, OUTPUT, SIGNATURE, ImageOptions
from ortpack.kernel.errors import one_line
from ortpack.kernel.gates import gate, probability_metrics
from ortpack.kernel.images import DECODE_GATE, ImageDecoder

log = logging.getLogger("ortpack.export")

# Reduced JPEG decoding: the shorter side is kept at least margin x resize_size, for the smallest
# margin that passes the decode gate (measured: README "Image classification"); a margin is judged
# only when it reduces at least MIN_REDUCED_FILES validation files.
REDUCED_MARGINS = (1.5, 2.0, 3.0, 4.0)
MIN_REDUCED_FILES = 8


class Classifier(nn.Module):
    """The network followed by softmax: probabilities, not logits, leave the graph."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.network(pixels), dim=1)


def read_labels(labels: str | None, source: str, classes: int, weights: str | None = None) -> list[str]:
    if labels is None:
        return default_labels(parse_image_source(source, local=False), classes, weights)
    return read_labels_file(labels, classes, source)


@torch.inference_mode()
def reference_outputs(
    classifier: Classifier, pre: dict[str, Any], images: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """torchvision-preprocessed pixels (uint8 [N, 3, crop, crop]) and PyTorch probabilities."""
    transform = reference_transform(pre)
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    pixels = np.stack([transform(torch.from_numpy(im).permute(2, 0, 1)).numpy() for im in images])
    probs = []
    for start in range(0, len(pixels), 8):
        batch = torch.from_numpy(pixels[start : start + 8]).float() / 255.0
        probs.append(classifier((batch - mean) / std).numpy())
    return pixels, np.concatenate(probs).astype(np.float32)


@torch.inference_mode()
def classify_pixels(classifier: Classifier, pre: dict[str, Any], rgb: np.ndarray) -> np.ndarray:
    """PyTorch's probabilities for one decoded image: torchvision's transforms, then the model."""
    transform = reference_transform(pre)
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    pixels = transform(torch.from_numpy(np.array(rgb)).permute(2, 0, 1))[None].float() / 255.0
    return classifier((pixels - mean) / std)[0].numpy().astype(np.float32)


def choose_decode(
    classifier: Classifier,
    pre: dict[str, Any],
    files: list[bytes],
    reference: np.ndarray,
) -> tuple[dict[str, Any], dict[str, float], np.ndarray]:
    """The server's default decode: reduced JPEG decoding at the smallest margin (shorter side at
    least `margin x resize_size`, from `REDUCED_MARGINS`) whose PyTorch outputs pass the decode
    gate (`ortpack.kernel.images.DECODE_GATE`) against the full decode on the validation files it
    reduces; exact decoding when none does, or when too few files are reduced to judge.

    Returns the manifest's decode fields, the numbers of every margin tried, and per file the
    largest probability difference of the chosen reduced decode (0 where it does not reduce)."""

    metrics: dict[str, float] = {}
    for margin in REDUCED_MARGINS:
        side = math.ceil(margin * pre["resize_size"])
        decoder = ImageDecoder(max_pixels=1 << 40, reduce_to=side)
        reduced, rows = [], []
        for i, data in enumerate(files):
            rgb = decoder.decode(data, "validation image")
            full = reference_decode_size(data)
            if rgb.shape[0] * rgb.shape[1] < full:
                reduced.append(i)
                rows.append(classify_pixels(classifier, pre, rgb))
        key = f"decode.x{margin:g}"
        metrics[f"{key}.images"] = float(len(reduced))
        if len(reduced) < MIN_REDUCED_FILES:
            log.info("export: reduced decoding at %d px reduces only %d validation files", side, len(reduced))
            continue
        values = probability_metrics(reference[reduced], np.stack(rows))
        metrics.update({f"{key}.{name}": value for name, value in values.items()})
        misses = gate(values, DECODE_GATE, CONTRACT.gates)
        log.info(
            "export: reduced decoding at %d px (%gx), %d files: top-1 %.3f (%.3f on %d decisive), top-5 %.3f, "
            "max |diff| %.3f%s",
            side,
            margin,
            len(reduced),
            values["top1_agreement"],
            values["decisive_top1_agreement"],
            int(values["decisive_rows"]),
            values["top5_agreement"],
            values["max_abs_diff"],
            f": misses {'; '.join(misses)}" if misses else "",
        )
        if not misses:
            per_file = np.zeros(len(files), dtype=np.float32)
            per_file[reduced] = np.abs(np.stack(rows) - reference[reduced]).max(axis=1)
            return {"decode": "reduced", "decode_min_side": side}, metrics, per_file
    return {"decode": "exact", "decode_min_side": 0}, metrics, np.zeros(len(files), dtype=np.float32)


def _classifier(network: nn.Module, crop: int) -> tuple[Classifier, int]:
    """The network followed by softmax, and how many classes it tells apart (one probe)."""
    classifier = Classifier(network).eval()
    with torch.inference_mode():
        classes = int(classifier(torch.zeros(1, 3, crop, crop)).shape[1])
    return classifier, classes


def _export(spec: ExportSpec, pre: dict[str, Any], classifier: Classifier, classes: int, out_dir: Path) -> None:
    """model.onnx and preprocess.onnx (`export_graphs`); any failure is one ExportError line."""
    log.info("export: %s to ONNX (opset %d) with preprocessing in the graph", spec.source, spec.opset)
    try:
        export_graphs(pre, classifier, SIGNATURE.output(OUTPUT), {"classes": classes}, out_dir, spec.opset)
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"cannot export {spec.source} to ONNX: {one_line(exc, 300)}") from None


def _write_reference(
    classifier: Classifier, pre: dict[str, Any], validation: ValidationSet, out_dir: Path
) -> tuple[dict[str, Any], dict[str, float]]:
    """reference.npz: PyTorch's probabilities of the raw images (through torchvision's
    transforms) and of the files (decoded by Pillow), and the server's default decode chosen on
    them (`choose_decode`). Returns the decode's manifest fields and its metrics."""
    pixels, probs = reference_outputs(classifier, pre, validation.images)
    served = np.stack([classify_pixels(classifier, pre, reference_decode(f)) for f in validation.files])
    if not (np.isfinite(probs).all() and np.isfinite(served).all()):
        raise ExportError("the PyTorch model produces non-finite probabilities on the validation images")
    decode, decode_metrics, reduced_diff = choose_decode(classifier, pre, validation.files, served)
    log.info("export: the server's default decode: %s", _describe_decode(decode))
    offsets, data = pack_files(validation.files)
    Reference.write(
        out_dir / REFERENCE_FILE,
        dict(
            task=np.array("image-classification"),
            **validation.raw,
            pixels=pixels,
            outputs=probs,
            input_names=np.array([INPUT_NAME]),
            served_names=np.array(validation.names),
            served_formats=np.array(validation.formats),
            served_sizes=np.array(validation.sizes),
            served_offsets=offsets,
            served_data=data,
            served_outputs=served,
            served_reduced_diff=reduced_diff,
        ),
    )
    return decode, decode_metrics


def _write_calibration(calibration: list[tuple[str, bytes]], out_dir: Path) -> None:
    """The user's calibration photos, packed, beside the export (`CALIBRATION_FILE`)."""
    offsets, data = pack_files([data for _, data in calibration])
    np.savez(out_dir / CALIBRATION_FILE, offsets=offsets, data=data)


def export_image_classifier(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a torchvision model name) into `out_dir`; return what was written."""
    opts = spec.options_as(ImageOptions)
    import onnx
    import torchvision

    if spec.opset < MIN_OPSET:
        raise InvalidSpecError(f"image models export at opset {MIN_OPSET} or later, not {spec.opset}")
    pre = preprocessing_spec(spec)
    source = parse_image_source(spec.source)
    photos = read_image_files(opts.validation_images, "validation images") if opts.validation_images else None
    calibration = read_image_files(opts.calibration_images, "calibration images") if opts.calibration_images else None
    network, source_record = load_image_network(source, opts.weights, pre["crop_size"])
    t0 = time.perf_counter()
    classifier, classes = _classifier(network, pre["crop_size"])
    labels = read_labels(opts.labels, spec.source, classes, opts.weights)
    out_dir.mkdir(parents=True, exist_ok=True)
    _export(spec, pre, classifier, classes, out_dir)
    seconds = time.perf_counter() - t0
    graph = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)

    if photos is None:
        validation = generated_validation_set()
    else:
        validation = photo_validation_set(photos, pre["crop_size"], str(opts.validation_images))
    decode, decode_metrics = _write_reference(classifier, pre, validation, out_dir)
    if calibration is not None:
        _write_calibration(calibration, out_dir)
    latency = torch_latency(classifier, pre)

    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="image-classification",
        name=spec.name,
        source=source_record,
        inputs=[t.spec() for t in SIGNATURE.inputs],
        outputs=[t.spec({"classes": classes}) for t in SIGNATURE.outputs],
        opset=spec.opset,
        model_info={"model_type": source.default_name, "classes": classes, "crop_size": pre["crop_size"]},
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": (out_dir / "model.onnx").stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(validation.images)),
            "validation_files": float(len(validation.files)),
            **decode_metrics,
        },
        torch_latency=latency,
        versions={"torch": torch.__version__, "torchvision": torchvision.__version__, "onnx": onnx.__version__},
        task_settings={"preprocessing": preprocessing_settings(pre, decode), "labels": labels},
        extra_files=[],
    )


def _describe_decode(decode: dict[str, Any]) -> str:
    if decode["decode"] == "exact":
        return "exact (no reduced JPEG decoding passed its gate)"
    return f"reduced JPEG decoding, shorter side >= {decode['decode_min_side']} px"
