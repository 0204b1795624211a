"""The "shorter side to `min_size` unless the longer passes `max_size`" resize of torchvision's
detectors and DETR-style processors, with an output size the exported graph computes exactly.

torchvision's `GeneralizedRCNNTransform` scales by a factor; exported, ONNX `Resize` recomputes
the output size in float32 and floors it: a 1944-pixel side scaled to 128 becomes 127 in the graph
and 128 in PyTorch (measured: 2592x1944, 1500x2000 and 3000x4000 photos), so the network sees
different pixels and a detector's answers change. Here the size is computed in integers,
floor(side x numerator / denominator), the same in PyTorch and in the graph, and handed to
`interpolate` as a size (bilinear, half-pixel centres, no antialiasing, as before).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def resize_to_fit(image: Tensor, min_size: int, max_size: int) -> Tensor:
    """`image` [3, H, W] scaled by min(min_size / shorter, max_size / longer), the output size
    floored in integer arithmetic."""
    hw = torch._shape_as_tensor(image)[-2:]
    shorter, longer = hw.min(), hw.max()
    by_shorter = min_size * longer <= max_size * shorter
    numerator = torch.where(by_shorter, torch.tensor(min_size), torch.tensor(max_size))
    denominator = torch.where(by_shorter, shorter, longer)
    size = torch.div(hw * numerator, denominator, rounding_mode="floor")
    # tensors as the size: traced as the graph's own computation, not constants
    traced_size: Any = (size[0], size[1])
    return F.interpolate(image[None], size=traced_size, mode="bilinear", align_corners=False)[0]


def exact_resize(network: Any) -> None:
    """Give a torchvision detector's transform `resize_to_fit` (a builder with a fixed size, SSD's,
    keeps its own: its output size is a constant)."""
    transform = getattr(network, "transform", None)
    if transform is None or getattr(transform, "fixed_size", None) is not None:
        return

    def resize(self: Any, image: Tensor, target: Any = None) -> tuple[Tensor, Any]:
        if self.training or target is not None:  # only inference is exported
            return type(self).resize(self, image, target)
        return resize_to_fit(image, int(self.min_size[-1]), int(self.max_size)), target

    transform.resize = types.MethodType(resize, transform)
