"""What the tasks whose inputs are images share: the raw input contract and the preprocessing
baked into the graph (with how the server decodes JPEGs), the export options of an image model,
and the input tensor. A leaf beside base.py: each image task's contract imports it."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from ortpack.kernel.contracts.base import Strict, TaskOptions
from ortpack.kernel.contracts.tensors import BATCH, Tensor

# Raw RGB pixels of any size, as decoded from the file (several images in one batch share a size)
IMAGES = Tensor("images", "uint8", (BATCH, "height", "width", 3))


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


class ImageModelOptions(TaskOptions):
    """An image model's export options: its weights (a path or URI; default random weights),
    preprocessing overrides (default the weights' own transforms, else ImageNet's) and
    directories of the user's photos to validate and calibrate on (default generated images)."""

    FILES: ClassVar[tuple[str, ...]] = ("weights",)
    DIRECTORIES: ClassVar[tuple[str, ...]] = ("validation_images", "calibration_images")

    weights: str | None = None
    resize_size: Size | None = None
    crop_size: Size | None = None
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    validation_images: str | None = None
    calibration_images: str | None = None
