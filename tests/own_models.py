"""Small user-style image classifiers for the "your own model" tests, importable as
`tests.own_models:FACTORY` (what `--model PACKAGE.MODULE:FACTORY` names)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class TinyNet(nn.Module):
    """Two convolutions, pooling and a linear head over 10 classes; seeded, with a scaled head so
    its softmax differs between images (a non-degenerate reference)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU()
        )
        self.head = nn.Linear(32, 10)
        with torch.no_grad():
            self.head.weight.mul_(40.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def tiny_net() -> TinyNet:
    return TinyNet()


def not_a_module() -> dict[str, int]:
    return {"layers": 2}


def broken() -> nn.Module:
    raise RuntimeError("the factory needs a GPU")


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3)) + y


def two_inputs() -> TwoInputs:
    return TwoInputs()


class TinyYolo(nn.Module):
    """A detector in YOLOv8's output form, `[batch, 4 + 2 classes, anchors]`: one box per 32x32
    cell (centre within the cell, width and height up to half the input), two class scores; seeded,
    its scores spread so that images differ in what it finds."""

    names: ClassVar[dict[int, str]] = {0: "round", 1: "square"}

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cells = nn.Sequential(nn.Conv2d(3, 16, 8, stride=8), nn.ReLU(), nn.Conv2d(16, 6, 4, stride=4))
        with torch.no_grad():
            self.cells[2].weight.mul_(8.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.cells(x - 0.5)  # [B, 6, H / 32, W / 32]
        h, w = out.shape[2:]
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        cx = (xs + torch.sigmoid(out[:, 0])) * 32
        cy = (ys + torch.sigmoid(out[:, 1])) * 32
        size = torch.sigmoid(out[:, 2:4]) * (x.shape[-1] / 2)
        boxes = torch.cat([cx[:, None], cy[:, None], size], 1)
        return torch.cat([boxes, torch.sigmoid(out[:, 4:])], 1).flatten(2)


def tiny_yolo() -> TinyYolo:
    return TinyYolo()
