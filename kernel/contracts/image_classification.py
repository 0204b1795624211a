"""The image-classification contract: the raw input and the preprocessing baked into the graph
(and how the server decodes JPEGs), the labels, and a gate on probabilities, top-k agreement and
the preprocessing's pixels."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from ortpack.kernel.contracts.base import Strict, TaskContract, TaskOptions, TaskSettings
from ortpack.kernel.gates import ceiling, floor, gate_table


class ImagePreprocessing(Strict):
    """The raw input contract of an image graph and the preprocessing baked into it."""

    input_dtype: Literal["uint8"] = "uint8"
    layout: Literal["NHWC"] = "NHWC"
    value_range: tuple[int, int] = (0, 255)
    color: Literal["RGB"] = "RGB"
    resize_size: int = Field(gt=0)
    crop_size: int = Field(gt=0)
    interpolation: Literal["bilinear", "bicubic"] = "bilinear"
    antialias: bool = True
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    # How the server decodes JPEGs by default, as the parity gate measured it: "exact" (every
    # pixel, like the PyTorch reference) or "reduced" (libjpeg's DCT scaling to the smallest of
    # 1/2, 1/4, 1/8 that keeps the shorter side >= decode_min_side). Each variant's parity values
    # say whether its gate validated the reduced path (kernel/images.py); bundles without the
    # field decode exactly.
    decode: Literal["exact", "reduced"] = "exact"
    decode_min_side: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check_decode(self) -> ImagePreprocessing:
        if (self.decode == "reduced") != (self.decode_min_side > 0):
            raise ValueError("decode 'reduced' needs decode_min_side > 0 (and 'exact' none)")
        return self


Size = Annotated[int, Field(ge=8, le=2048)]


class ImageOptions(TaskOptions):
    """An image model's export options: its weights and labels (paths or URIs; default random
    weights and the weights' categories), preprocessing overrides (default the weights' own
    transforms, else ImageNet's) and directories of the user's photos to validate and calibrate
    on (default generated images)."""

    FILES: ClassVar[tuple[str, ...]] = ("weights", "labels")
    DIRECTORIES: ClassVar[tuple[str, ...]] = ("validation_images", "calibration_images")

    weights: str | None = None
    labels: str | None = None
    resize_size: Size | None = None
    crop_size: Size | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    validation_images: str | None = None
    calibration_images: str | None = None


class ImageClassificationSettings(TaskSettings):
    task: Literal["image-classification"] = "image-classification"
    preprocessing: ImagePreprocessing
    labels: list[str] | None = None


CONTRACT = TaskContract(
    name="image-classification",
    options=ImageOptions,
    settings=ImageClassificationSettings,
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("top1_agreement"),
        floor("top5_agreement"),
        floor("decisive_top1_agreement"),
        ceiling("max_pixel_diff"),
    ),
    plugin="ortpack.serving.tasks.image_classification",
)
