"""The semantic-segmentation contract: raw images in, each image's class map out, one class index
per pixel at the image's own size (the resize, normalisation, network, the logits resized back to
the image and the per-pixel argmax all inside the graph); gated by pixel agreement with PyTorch's
map and the mean IoU of the classes present."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from ortpack.kernel.contracts.base import Strict, TaskContract, TaskSettings, fixed
from ortpack.kernel.contracts.images import IMAGES, ImageModelOptions
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import floor, gate_table

OUTPUT = "label_map"  # uint8 [batch, height, width]: the class of each pixel
MAX_CLASSES = 256  # a class index is one uint8 (PASCAL VOC 21, Cityscapes 19, ADE20K 150, COCO-Stuff 171)


class SegmentationPreprocessing(Strict):
    """The raw input contract and the preprocessing baked into the graph: `resize` "shorter" (the
    shorter side to `size`, the aspect kept: torchvision's segmentation transforms) or "fixed"
    (both sides to `size`: SegFormer's and UperNet's processors), antialiased, then `mean` and
    `std`. The map is at the decoded image's size: the logits are resized back to it (bilinear,
    half-pixel centres: `F.interpolate(..., align_corners=False)`) before the argmax."""

    input_dtype: Literal["uint8"] = "uint8"
    layout: Literal["NHWC"] = "NHWC"
    color: Literal["RGB"] = "RGB"
    resize: Literal["shorter", "fixed"]
    size: int = Field(ge=8, le=4096)
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"
    antialias: bool = True
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    decode: Literal["exact"] = "exact"


class SegmentationOptions(ImageModelOptions):
    """A segmenter's export options: an image model's (weights, `resize_size` as the size, photos),
    its labels (a path or URI; default the weights' categories or the checkpoint's id2label) and
    `resize` ("shorter" or "fixed"; default the model's own)."""

    FILES: ClassVar[tuple[str, ...]] = ("weights", "labels")

    labels: str | None = None
    resize: Literal["shorter", "fixed"] | None = None


class SemanticSegmentationSettings(TaskSettings):
    task: Literal["semantic-segmentation"] = "semantic-segmentation"
    preprocessing: SegmentationPreprocessing
    labels: list[str] = Field(min_length=1, max_length=MAX_CLASSES)


SIGNATURE = Signature(inputs=(IMAGES,), outputs=(Tensor(OUTPUT, "uint8", (BATCH, "height", "width")),))

CONTRACT = TaskContract(
    name="semantic-segmentation",
    options=SegmentationOptions,
    settings=SemanticSegmentationSettings,
    signature=fixed(SIGNATURE),
    gates=gate_table(
        floor("pixel_agreement"),
        floor("min_image_agreement"),
        floor("mean_iou"),
        floor("decisive_pixel_agreement"),
    ),
    engine="ortpack.kernel.engines.semantic_segmentation",
    plugin="ortpack.serving.tasks.semantic_segmentation",
)
