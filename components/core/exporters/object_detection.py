"""Export an object detector with its preprocessing, box decoding and non-maximum suppression in the
graph: raw uint8 `images` `[batch, height, width, 3]` (RGB, any size) in, each image's detections
out (`boxes` as corners in the image's own pixels, `scores`, `labels`, and `batch_index`: which
image each detection is of).

Two kinds of detector:

- torchvision's detection builders by name (`detection_builders()`: every one torchvision lists:
  Faster R-CNN v1/v2, RetinaNet v1/v2, FCOS, SSD, SSDlite; Mask and Keypoint R-CNN for their
  boxes), `--weights` a state_dict (default random weights), labels the weights' categories
  (COCO's), the score threshold the builder's own. The model's
  own transform (resize, normalise) and post-processing (box decoding, score threshold, NMS, the
  boxes scaled back to the image) are in its graph: exported whole, for one image per call.
- a Hugging Face detector checkpoint directory (DETR, Conditional DETR, YOLOS, RT-DETR, ...; its
  processor's resize and post-processing around it: hf_detection.py), exported whole the same way.
- your own module (`PACKAGE.MODULE:FACTORY`) or a `torch.export` program (`FILE.pt2`), with the
  `decoder` option saying what its forward returns: "yolo", raw head outputs `[batch, 4 +
  classes, anchors]` (centre x, y, width, height in input pixels, then class scores: Ultralytics'
  YOLOv8 head), for which the letterbox and the decoding are built around it
  (detection_graphs.py); "boxes", torchvision's form (a list of {boxes, scores, labels} per
  image, from a list of float CHW images in [0, 1]), exported whole like the builders.

The reference is PyTorch on each validation file as the server would get it (Pillow's full decode),
written to reference.npz with the files themselves; `outputs` there is each file's count of
detections and best score (what the export step's degenerate check reads: a detector that finds
nothing on the validation photos proves nothing).
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, InvalidSpecError, ModelLoadError, did_you_mean
from ortpack.components.core.exporters.detection_graphs import (
    PIXELS_NAME,
    RAW_NAME,
    YoloReference,
    compose,
    decode_graph,
    letterbox_graph,
)
from ortpack.components.core.exporters.detection_resize import exact_resize
from ortpack.components.core.exporters.hf_detection import hf_detector_type, load_hf_detector
from ortpack.components.core.exporters.image_common import (
    INPUT_NAME,
    batch_group,
    format_of,
    labels_for,
    reference_decode,
    validation_files,
)
from ortpack.components.core.exporters.image_models import (
    PROGRAM_SUFFIX,
    ImageSource,
    call_factory,
    is_factory,
    load_program,
    load_weights,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import measure_latency
from ortpack.components.core.validation_data import (
    CALIBRATION_FILE,
    ImageSpec,
    pack_files,
    read_image_files,
    render_image,
)
from ortpack.kernel.bundle import sha256_file
from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.contracts.object_detection import (
    BOXES,
    LABELS,
    SCORES,
    SIGNATURE,
    DetectionOptions,
    DetectionPreprocessing,
    Thresholds,
)
from ortpack.kernel.contracts.tensors import BATCH
from ortpack.kernel.errors import one_line

log = logging.getLogger("ortpack.export")


def detection_builders() -> list[str]:
    """Every detection builder torchvision lists (random weights unless --weights)."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models.detection))


MIN_OPSET = 13
BENCH_SHAPES = {"b1_480x640": (1, 480, 640)}
YOLO_DEFAULTS = Thresholds(score=0.25, iou=0.45, max_detections=300)  # Ultralytics' predict defaults


@dataclass(frozen=True)
class DetectionSource:
    kind: str  # "torchvision", "huggingface", "factory" or "program"
    value: str

    @property
    def default_name(self) -> str:
        if self.kind == "huggingface":
            return Path(self.value).name
        if self.kind == "factory":
            return ImageSource("factory", self.value).default_name
        if self.kind == "program":
            return Path(self.value).name.removesuffix(PROGRAM_SUFFIX)
        return self.value


def parse_detection_source(value: str, *, local: bool = True) -> DetectionSource:
    """What `--model` names for object detection; `local` checks that a .pt2 path exists and a
    factory's module can be found here."""
    if value in detection_builders():
        return DetectionSource("torchvision", value)
    if "://" not in value and hf_detector_type(value) is not None:
        return DetectionSource("huggingface", str(Path(value).expanduser().resolve()) if local else value)
    if is_factory(value, local=local):
        return DetectionSource("factory", value)
    if value.endswith(PROGRAM_SUFFIX):
        path = Path(value).expanduser()
        if local and "://" not in value and not path.is_file():
            raise ModelLoadError(f"exported program not found: {value}")
        return DetectionSource("program", str(path.resolve()) if local and "://" not in value else value)
    known = detection_builders()
    raise ModelLoadError(
        f"unknown detection model {value!r}{did_you_mean(value, known)}: give a torchvision detection builder "
        f"({', '.join(known)}), a Hugging Face detector directory, your own module as PACKAGE.MODULE:FACTORY, "
        "or a torch.export "
        "program FILE.pt2 (with --task-option decoder=yolo or decoder=boxes)"
    )


@dataclass(frozen=True)
class Detector:
    """What was loaded: the network, its kind of outputs, its labels, thresholds and the source record."""

    network: nn.Module
    decoder: str
    labels: list[str]
    thresholds: Thresholds
    record: dict[str, Any]


def load_detector(source: DetectionSource, opts: DetectionOptions) -> Detector:
    import torchvision

    weights_sha = sha256_file(Path(opts.weights)) if opts.weights else None
    if source.kind == "torchvision":
        from torchvision.models import get_model_weights

        network = torchvision.models.get_model(source.value, weights=None, weights_backbone=None)
        revision = f"torchvision=={torchvision.__version__}"
        labels = list(get_model_weights(source.value).DEFAULT.meta["categories"])
        exact_resize(network)  # the graph's resized size equals PyTorch's (detection_resize.py)
        head = getattr(network, "roi_heads", network)  # where _set_thresholds finds the builder's own
        decoder, defaults = "boxes", Thresholds(score=float(getattr(head, "score_thresh", 0.05)))
    elif source.kind == "huggingface":
        network, labels, hf_record = load_hf_detector(source.value, hf_detector_type(source.value) or "", opts.weights)
        revision, weights_sha = str(hf_record["revision"]), hf_record["weights_sha256"]
        decoder = "boxes"
        defaults = Thresholds(score=network.score_thresh, max_detections=network.detections_per_img)
    else:
        if opts.decoder is None:
            raise InvalidSpecError(
                f"say what {source.value} returns: --task-option decoder=yolo (raw head outputs [batch, 4 + "
                "classes, anchors]) or decoder=boxes (torchvision's list of {boxes, scores, labels})"
            )
        if source.kind == "factory":
            network, revision = call_factory(source.value), ""
        else:
            if opts.weights:
                raise InvalidSpecError(f"--weights does not apply to an exported program ({source.value})")
            network, revision = load_program(source.value), f"sha256:{sha256_file(Path(source.value))}"
        names = getattr(network, "names", None)  # Ultralytics' convention: {index: name}
        labels = [str(names[i]) for i in sorted(names)] if isinstance(names, dict) else []
        decoder = opts.decoder
        defaults = YOLO_DEFAULTS if decoder == "yolo" else Thresholds()
    if opts.weights:
        load_weights(network, opts.weights, source.value)
    elif source.kind not in ("program", "huggingface"):
        log.warning("export: %s has random weights (no --weights given)", source.value)
    network = network.float().eval()
    if source.kind == "torchvision":
        boxes_only(network)
    thresholds = Thresholds(
        score=defaults.score if opts.score_threshold is None else opts.score_threshold,
        iou=defaults.iou if opts.iou_threshold is None else opts.iou_threshold,
        max_detections=opts.max_detections or defaults.max_detections,
    )
    if decoder == "boxes":
        _set_thresholds(network, thresholds)
    record = {"kind": source.kind, "id": source.value, "revision": revision, "weights_sha256": weights_sha}
    if source.kind in ("program", "huggingface"):
        record["id"] = Path(source.value).name
    return Detector(network=network, decoder=decoder, labels=labels, thresholds=thresholds, record=record)


def boxes_only(network: nn.Module) -> None:
    """Mask R-CNN's and Keypoint R-CNN's mask and keypoint branches taken off (after their weights
    were loaded): the graph answers boxes, and the masks' paste-into-the-image loop exported as an
    ONNX Loop that ONNX Runtime's optimised graph refused ("Graph must be in single static
    assignment form"; torchvision 0.29, ORT 1.32)."""
    heads = getattr(network, "roi_heads", None)
    for branch in ("mask", "keypoint"):
        for part in ("roi_pool", "head", "predictor"):
            if getattr(heads, f"{branch}_{part}", None) is not None:
                setattr(heads, f"{branch}_{part}", None)


def _set_thresholds(network: nn.Module, thresholds: Thresholds) -> None:
    """torchvision's detectors keep their thresholds on the head that applies them."""
    head = getattr(network, "roi_heads", network)  # Faster R-CNN: roi_heads; the others: the model
    for name, value in (
        ("score_thresh", thresholds.score),
        ("nms_thresh", thresholds.iou),
        ("detections_per_img", thresholds.max_detections),
    ):
        if hasattr(head, name):
            setattr(head, name, value)


class BoxesDetector(nn.Module):
    """A torchvision-form detector for one uint8 RGB image `[1, H, W, 3]`: its detections and a
    `batch_index` of zeros."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        image = images[0].permute(2, 0, 1).float() / 255.0
        out = self.network([image])[0]
        labels = out["labels"].to(torch.int64)
        return out["boxes"], out["scores"], labels, torch.zeros_like(labels)

    @torch.inference_mode()
    def reference(self, image: np.ndarray) -> dict[str, np.ndarray]:
        boxes, scores, labels, _ = self(torch.from_numpy(np.ascontiguousarray(image))[None])
        order = torch.argsort(scores, descending=True, stable=True)
        return {
            BOXES: boxes[order].numpy().astype(np.float32),
            SCORES: scores[order].numpy().astype(np.float32),
            LABELS: labels[order].numpy().astype(np.int64),
        }


def classes_of(network: nn.Module, size: int) -> int:
    """A raw head's class count: its output's channels less the 4 box coordinates."""
    with torch.inference_mode():
        raw = network(torch.zeros(1, 3, size, size))
    if not isinstance(raw, torch.Tensor) or raw.dim() != 3 or raw.shape[1] < 5:
        shape = tuple(raw.shape) if isinstance(raw, torch.Tensor) else type(raw).__name__
        raise ModelLoadError(f"decoder=yolo needs raw head outputs [batch, 4 + classes, anchors]; got {shape}")
    return int(raw.shape[1]) - 4


def export_graph(detector: Detector, size: int, pad_value: int, out_dir: Path, opset: int) -> int:
    """model.onnx for the detector; returns its class count."""
    import onnx

    path = out_dir / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if detector.decoder == "boxes":
            torch.onnx.export(
                BoxesDetector(detector.network).eval(),
                (torch.zeros(1, 300, 400, 3, dtype=torch.uint8),),
                str(path),
                dynamo=False,
                opset_version=opset,
                input_names=[IMAGES.name],
                output_names=[t.name for t in SIGNATURE.outputs],
                # one image a call (max_batch 1); every declared free dimension dynamic
                dynamic_axes={t.name: t.dynamic_axes() for t in (*SIGNATURE.inputs, *SIGNATURE.outputs)},
            )
            return len(detector.labels)
        classes = classes_of(detector.network, size)
        net_path = out_dir / "network.onnx"
        torch.onnx.export(
            detector.network,
            (torch.zeros(2, 3, size, size),),
            str(net_path),
            dynamo=False,
            opset_version=opset,
            input_names=[PIXELS_NAME],
            output_names=[RAW_NAME],
            dynamic_axes={PIXELS_NAME: {0: BATCH}, RAW_NAME: {0: BATCH}},
        )
    net = onnx.load(str(net_path))
    net_path.unlink()
    t = detector.thresholds
    model = compose(
        letterbox_graph(size, pad_value, opset), net, decode_graph(classes, t.score, t.iou, t.max_detections, opset)
    )
    onnx.save(model, str(path))
    return classes


def pack_detections(items: list[dict[str, np.ndarray]], prefix: str) -> dict[str, np.ndarray]:
    """Per-image detections end to end, with each image's end (`<prefix>_ends`)."""
    return {
        f"{prefix}_ends": np.cumsum([len(i[SCORES]) for i in items]).astype(np.int64),
        f"{prefix}_boxes": np.concatenate([i[BOXES] for i in items]).reshape(-1, 4).astype(np.float32),
        f"{prefix}_scores": np.concatenate([i[SCORES] for i in items]).astype(np.float32),
        f"{prefix}_labels": np.concatenate([i[LABELS] for i in items]).astype(np.int64),
    }


def export_object_detector(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` into `out_dir`; return what was written."""
    import onnx
    import torchvision

    opts = spec.options_as(DetectionOptions)
    if spec.opset < MIN_OPSET:
        raise InvalidSpecError(f"detectors export at opset {MIN_OPSET} or later, not {spec.opset}")
    source = parse_detection_source(spec.source)
    files = validation_files(opts)
    calibration = read_image_files(opts.calibration_images, "calibration images") if opts.calibration_images else []
    detector = load_detector(source, opts)
    letterbox = DetectionPreprocessing.model_fields  # the contract's defaults: YOLO's 640 px, grey 114
    size = opts.input_size or int(letterbox["size"].default)
    pad_value = int(letterbox["pad_value"].default)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log.info("export: %s to ONNX (opset %d), decoding and NMS in the graph", spec.source, spec.opset)
    try:
        classes = export_graph(detector, size, pad_value, out_dir, spec.opset)
    except (ModelLoadError, InvalidSpecError):
        raise
    except Exception as exc:  # noqa: BLE001 - any exporter failure: one line
        raise ExportError(f"cannot export {spec.source} to ONNX: {one_line(exc, 300)}") from None
    seconds = time.perf_counter() - t0
    labels = labels_for(opts.labels, detector.labels, classes)
    reference = (
        YoloReference(detector.network, size, pad_value, *_t(detector.thresholds))
        if detector.decoder == "yolo"
        else BoxesDetector(detector.network).eval().reference
    )
    decoded = [reference_decode(data) for _, data in files]
    log.info("export: PyTorch reference detections on %d files", len(files))
    served = [reference(image) for image in decoded]
    group = batch_group(decoded) if detector.decoder == "yolo" else []
    grouped = [reference(image) for image in group]
    if calibration:
        calibration_offsets, calibration_data = pack_files([d for _, d in calibration])
        np.savez(out_dir / CALIBRATION_FILE, offsets=calibration_offsets, data=calibration_data)
    offsets, data = pack_files([data for _, data in files])
    arrays: dict[str, np.ndarray] = {
        "task": np.array("object-detection"),
        "input_names": np.array([INPUT_NAME]),
        "served_names": np.array([name for name, _ in files]),
        "served_formats": np.array([format_of(data) for _, data in files]),
        "served_offsets": offsets,
        "served_data": data,
        "outputs": np.array([[len(d[SCORES]), float(d[SCORES].max(initial=0.0))] for d in served], dtype=np.float32),
        "batch_images": np.stack(group) if group else np.zeros((0, 1, 1, 3), dtype=np.uint8),
        **pack_detections(served, "served"),
        **(pack_detections(grouped, "batch") if grouped else {}),
    }
    Reference.write(out_dir / REFERENCE_FILE, arrays)
    total = sum(len(d[SCORES]) for d in served)
    log.info("export: %d reference detections on %d files", total, len(files))
    graph = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)
    mode = "letterbox" if detector.decoder == "yolo" else "model"
    preprocessing = {"mode": mode, "size": size, "pad_value": pad_value}
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="object-detection",
        name=spec.name,
        source=detector.record,
        inputs=[t.spec() for t in SIGNATURE.inputs],
        outputs=[t.spec() for t in SIGNATURE.outputs],
        opset=spec.opset,
        model_info={"model_type": source.default_name, "classes": classes, "decoder": detector.decoder},
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": (out_dir / "model.onnx").stat().st_size / 1e6,
            "seconds": seconds,
            "validation_files": float(len(files)),
            "reference_detections": float(total),
        },
        torch_latency=_torch_latency(reference, detector.decoder),
        versions={"torch": torch.__version__, "torchvision": torchvision.__version__, "onnx": onnx.__version__},
        task_settings={
            "preprocessing": preprocessing,
            "thresholds": detector.thresholds.model_dump(),
            "labels": labels,
            "max_batch": 0 if detector.decoder == "yolo" else 1,
        },
        extra_files=[],
    )


def _t(thresholds: Thresholds) -> tuple[float, float, int]:
    return thresholds.score, thresholds.iou, thresholds.max_detections


def _torch_latency(reference: Any, decoder: str) -> dict[str, dict[str, float]]:
    """PyTorch's latency at `BENCH_SHAPES`: the whole path, decoding and NMS included."""
    log.info("export: measuring PyTorch eager latency (preprocessing, network, decoding, NMS)")
    latency = {}
    for key, (_, h, w) in BENCH_SHAPES.items():
        image = render_image(ImageSpec(h, w, "smooth", 1))
        latency[key] = measure_latency(partial(reference, image), budget_s=3.0)
    return latency
