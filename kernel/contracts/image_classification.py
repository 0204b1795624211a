"""The image-classification contract: the raw input and the preprocessing baked into the graph
(kernel/contracts/images.py, shared by the image tasks), the labels, and a gate on probabilities,
top-k agreement and the preprocessing's pixels."""

from __future__ import annotations

from typing import ClassVar, Literal

from ortpack.kernel.contracts.base import TaskContract, TaskSettings, fixed
from ortpack.kernel.contracts.images import IMAGES, ImageModelOptions, ImagePreprocessing
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table


class ImageOptions(ImageModelOptions):
    """An image classifier's export options: an image model's, and its labels (a path or URI;
    default the weights' categories)."""

    FILES: ClassVar[tuple[str, ...]] = ("weights", "labels")

    labels: str | None = None


class ImageClassificationSettings(TaskSettings):
    task: Literal["image-classification"] = "image-classification"
    preprocessing: ImagePreprocessing
    labels: list[str] | None = None


OUTPUT = "probabilities"
SIGNATURE = Signature(inputs=(IMAGES,), outputs=(Tensor(OUTPUT, "float32", (BATCH, "classes")),))

CONTRACT = TaskContract(
    name="image-classification",
    options=ImageOptions,
    settings=ImageClassificationSettings,
    signature=fixed(SIGNATURE),
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("top1_agreement"),
        floor("top5_agreement"),
        floor("decisive_top1_agreement"),
        ceiling("max_pixel_diff"),
    ),
    engine="ortpack.kernel.engines.image_classification",
    plugin="ortpack.serving.tasks.image_classification",
)
