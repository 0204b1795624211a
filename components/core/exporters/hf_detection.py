"""Hugging Face object detectors for their own task: a local checkpoint directory (config.json,
model.safetensors, preprocessor_config.json) of any model_type transformers loads with
`AutoModelForObjectDetection` (DETR, Conditional DETR, Deformable DETR, YOLOS, RT-DETR, ...).

`HfDetector` puts the detector in torchvision's form (a list of float CHW images in [0, 1] in, a
list of {boxes, scores, labels} out), so object_detection.py exports it whole like torchvision's
builders, one image per call, with:

- the processor's resize and normalisation: the shorter side to `shortest_edge` unless the longer
  would pass `longest_edge` (DETR, YOLOS: the processor's rule, bilinear without antialiasing,
  its size computed exactly in the graph: detection_resize.py), or a fixed height and width
  (RT-DETR); its `image_mean`/`image_std` when `do_normalize`;
- the processor's `post_process_object_detection`: boxes from relative centre form to corners in
  the photo's own pixels; scores a softmax over the classes without the last "no object" one
  (DETR, YOLOS), or a sigmoid over every query and class with the top `max_detections` of them
  (the others); detections over the score threshold (default 0.5, the processor's), best first.
  There is no NMS in these models, so `--iou-threshold` does not apply.

The gate compares the graph with this module in PyTorch. Hugging Face's own processor resizes with
Pillow (antialiased) and pads batches, so its boxes can differ slightly from these on downscaled
photos.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ortpack.components.core.errors import InvalidSpecError, ModelLoadError, one_line
from ortpack.components.core.exporters.detection_resize import resize_to_fit
from ortpack.components.core.exporters.hf_vision import checkpoint_model_type
from ortpack.kernel.bundle import sha256_file

# model_types whose class scores are a softmax with a trailing "no object" class (the others: a
# sigmoid per query and class, and the top scores over both)
SOFTMAX = ("detr", "yolos", "table-transformer")
SCORE_THRESHOLD = 0.5  # post_process_object_detection's default


def object_detection_types() -> dict[str, Any]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES

    return dict(MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES)


def hf_detector_type(value: str) -> str | None:
    """The model_type of a local Hugging Face object-detection checkpoint; None when `value` is not
    a checkpoint directory (ModelLoadError when it is one of another kind)."""
    model_type = checkpoint_model_type(value)
    if model_type is None:
        return None
    if model_type not in object_detection_types():
        raise ModelLoadError(
            f"{value} is a {model_type or 'unknown'} checkpoint, not one transformers loads as an object "
            "detector (AutoModelForObjectDetection)"
        )
    return model_type


class HfDetector(nn.Module):
    """A Hugging Face detector in torchvision's form (see the module); `score_thresh` and
    `detections_per_img` are where object_detection.py's `_set_thresholds` sets them."""

    def __init__(self, model: nn.Module, processor: dict[str, Any], softmax: bool) -> None:
        import torch

        super().__init__()
        self.model = model
        self.softmax = softmax
        self.score_thresh = SCORE_THRESHOLD
        # the processors' top_k (100; RT-DETR: every query)
        self.detections_per_img = max(100, int(getattr(model.config, "num_queries", 0)))
        size = processor.get("size") or {}
        if "shortest_edge" in size:
            self.min_size, self.max_size = int(size["shortest_edge"]), int(size.get("longest_edge") or 1333)
            self.fixed_size: tuple[int, int] | None = None
        elif "height" in size and "width" in size:
            self.min_size = self.max_size = 0
            self.fixed_size = (int(size["width"]), int(size["height"]))
        else:
            raise InvalidSpecError(f"the processor's size {size} is neither shortest/longest edge nor height/width")
        normalize = bool(processor.get("do_normalize", True))
        mean = processor.get("image_mean", [0.0] * 3) if normalize else [0.0] * 3
        std = processor.get("image_std", [1.0] * 3) if normalize else [1.0] * 3
        self.mean: Tensor
        self.std: Tensor
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(3, 1, 1), persistent=False)

    def forward(self, images: list[Tensor]) -> list[dict[str, Tensor]]:
        import torch
        import torch.nn.functional as F

        image = images[0]
        height_width = torch._shape_as_tensor(image)[-2:].to(torch.float32)
        if self.fixed_size is None:
            resized = resize_to_fit(image, self.min_size, self.max_size)
        else:
            width, height = self.fixed_size
            resized = F.interpolate(image[None], size=(height, width), mode="bilinear", align_corners=False)[0]
        out = self.model(pixel_values=((resized - self.mean) / self.std)[None])
        logits, boxes = out.logits[0], out.pred_boxes[0]
        if self.softmax:
            scores, labels = logits.softmax(-1)[:, :-1].max(-1)
        else:
            classes = logits.shape[-1]
            flat = logits.sigmoid().flatten()
            scores, index = flat.topk(min(int(flat.shape[0]), self.detections_per_img))
            labels, boxes = index % classes, boxes[index // classes]
        keep = scores > self.score_thresh
        scores, labels, boxes = scores[keep], labels[keep], boxes[keep]
        order = scores.argsort(descending=True)[: self.detections_per_img]
        cx, cy, w, h = boxes[order].unbind(-1)
        corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)
        scale = torch.stack([height_width[1], height_width[0], height_width[1], height_width[0]])
        return [{"boxes": corners * scale, "scores": scores[order], "labels": labels[order]}]


def load_hf_detector(value: str, model_type: str, weights: str | None) -> tuple[HfDetector, list[str], dict[str, Any]]:
    """The detector in torchvision's form, its labels (the config's id2label) and the source record."""
    import transformers

    if weights:
        raise InvalidSpecError(f"--weights does not apply to a Hugging Face checkpoint ({value} holds its own)")
    path = Path(value).expanduser().resolve()
    processor_file = path / "preprocessor_config.json"
    if not processor_file.is_file():
        raise ModelLoadError(f"{path} has no preprocessor_config.json (its resize, mean and std)")
    try:
        model = transformers.AutoModelForObjectDetection.from_pretrained(str(path), attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - any loading failure: one line
        raise ModelLoadError(f"cannot load {path} as an object detector: {one_line(exc, 300)}") from None
    processor = json.loads(processor_file.read_text())
    id2label = model.config.id2label or {}
    labels = [str(id2label.get(i, f"class_{i}")) for i in range(int(model.config.num_labels))]
    file = path / "model.safetensors"
    record = {
        "kind": "huggingface",
        "id": path.name,
        "revision": f"transformers=={transformers.__version__}",
        "weights_sha256": sha256_file(file) if file.is_file() else None,
    }
    return HfDetector(model.eval(), processor, model_type in SOFTMAX).eval(), labels, record
