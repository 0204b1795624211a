"""The object-detection contract: raw images in, each image's detections out (boxes in the image's
own pixel coordinates, scores, labels), with the model's resize or letterbox, box decoding, score
threshold and non-maximum suppression inside the graph; gated by matching the variant's detections
to PyTorch's per image."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ortpack.kernel.contracts.base import Strict, TaskContract, TaskSettings
from ortpack.kernel.contracts.images import IMAGES, ImageModelOptions
from ortpack.kernel.contracts.tensors import Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table

DETECTIONS = "detections"  # the count of an image's detections: it varies per image
BOXES, SCORES, LABELS, BATCH_INDEX = "boxes", "scores", "labels", "batch_index"


class Thresholds(Strict):
    """What the graph keeps: detections scoring above `score`, after class-wise non-maximum
    suppression at IoU `iou`, at most `max_detections` per image, best first. A request may ask
    for fewer (`min_score` above `score`, `top_k`), never for more."""

    score: float = Field(default=0.25, ge=0.0, lt=1.0)
    iou: float = Field(default=0.45, gt=0.0, le=1.0)
    max_detections: int = Field(default=100, ge=1, le=10_000)


class DetectionPreprocessing(Strict):
    """The raw input contract and the preprocessing baked into the graph: `letterbox` (the
    image scaled to fit `size` x `size` keeping its aspect, bilinear, padded with `pad_value`; YOLO)
    or `model` (the model resizes and normalises itself: torchvision's detectors). How the server
    decodes JPEGs (`decode`): always the full decode the reference used."""

    input_dtype: Literal["uint8"] = "uint8"
    layout: Literal["NHWC"] = "NHWC"
    color: Literal["RGB"] = "RGB"
    mode: Literal["letterbox", "model"]
    size: int = Field(default=640, ge=32, le=4096)
    pad_value: int = Field(default=114, ge=0, le=255)
    decode: Literal["exact"] = "exact"


class DetectionOptions(ImageModelOptions):
    """A detector's export options: an image model's (weights, validation and calibration photos),
    its labels (a path or URI; default the weights' categories), the thresholds, and for your own
    module `decoder`: "yolo" when its forward returns raw head outputs `[batch, 4 + classes,
    anchors]` (center x, y, width, height in input pixels, then class scores, as Ultralytics'
    YOLOv8 head exports), "boxes" when it returns per-image dicts of boxes, scores and labels
    (torchvision's form); `input_size`: the square a YOLO model was trained at."""

    FILES: ClassVar[tuple[str, ...]] = ("weights", "labels")

    labels: str | None = None
    score_threshold: float | None = Field(default=None, ge=0.0, lt=1.0)
    iou_threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    max_detections: int | None = Field(default=None, ge=1, le=10_000)
    decoder: Literal["yolo", "boxes"] | None = None
    input_size: int | None = Field(default=None, ge=32, le=4096)


class ObjectDetectionSettings(TaskSettings):
    task: Literal["object-detection"] = "object-detection"
    preprocessing: DetectionPreprocessing
    thresholds: Thresholds
    labels: list[str] = Field(min_length=1)
    # the most images one call takes (1: the graph was exported for one image, as torchvision's
    # detectors are; 0: any, images of one size)
    max_batch: int = Field(default=0, ge=0)


SIGNATURE = Signature(
    inputs=(IMAGES,),
    outputs=(
        Tensor(BOXES, "float32", (DETECTIONS, 4)),
        Tensor(SCORES, "float32", (DETECTIONS,)),
        Tensor(LABELS, "int64", (DETECTIONS,)),
        Tensor(BATCH_INDEX, "int64", (DETECTIONS,), item_index=True),
    ),
)


def signature(settings: ObjectDetectionSettings) -> Signature:
    return SIGNATURE


CONTRACT = TaskContract(
    name="object-detection",
    options=DetectionOptions,
    settings=ObjectDetectionSettings,
    signature=signature,
    gates=gate_table(
        floor("matched_recall", "min_matched_recall"),
        floor("matched_precision", "min_matched_precision"),
        floor("decisive_recall", "min_decisive_recall"),
        floor("decisive_precision", "min_decisive_precision"),
        floor("min_matched_iou", "min_matched_iou"),
        ceiling("max_box_diff_px"),
        ceiling("max_score_diff"),
        ceiling("max_count_diff"),
    ),
    engine="ortpack.kernel.engines.object_detection",
    plugin="ortpack.serving.tasks.object_detection",
)
