"""Small user-style image classifiers for the "your own model" tests, importable as
`tests.own_models:FACTORY` (what `--model PACKAGE.MODULE:FACTORY` names)."""

from __future__ import annotations

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
