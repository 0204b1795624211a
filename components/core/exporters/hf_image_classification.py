"""Hugging Face image classifiers for their own task: a local checkpoint directory (config.json,
model.safetensors, preprocessor_config.json) of any architecture transformers loads with
`AutoModelForImageClassification` (ViT, DeiT, BEiT, ConvNeXt/V2, Swin/V2, EfficientNet,
MobileViT/V2, ResNet, RegNet, LeViT, DINOv2 with a head, ...).

The network is the model's `logits`; the classifier adds the softmax (image_classification.py).
Labels are the config's `id2label`. The preprocessing comes from preprocessor_config.json by the
embedders' rule (hf_vision.hf_preprocessing): the shorter side resized then a centre crop when
that is the processor's own; a processor that stretches every image to a fixed size is refused
unless `--resize-size` and `--crop-size` say which resize and crop the graph uses instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortpack.components.core.errors import InvalidSpecError, ModelLoadError, one_line
from ortpack.components.core.exporters.hf_vision import checkpoint_model_type, other_head
from ortpack.kernel.bundle import sha256_file


def image_classification_types() -> dict[str, Any]:
    """transformers' model_type -> class name(s) table for image classification."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES

    return dict(MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES)


def hf_classifier_type(value: str) -> str | None:
    """The model_type of a local Hugging Face image-classification checkpoint, None when `value`
    is not a checkpoint directory (ModelLoadError when it is one of another kind)."""
    model_type = checkpoint_model_type(value)
    if model_type is None:
        return None
    head = other_head(value, "ForImageClassification")
    if head is not None:
        raise ModelLoadError(f"{value} holds {head} (its config's architectures name that head)")
    if model_type not in image_classification_types():
        raise ModelLoadError(
            f"{value} is a {model_type or 'unknown'} checkpoint, not one transformers loads as an image "
            "classifier (AutoModelForImageClassification)"
        )
    return model_type


def config_labels(value: str) -> list[str]:
    """The config's id2label in index order ([] when it has none)."""
    try:
        id2label = json.loads((Path(value).expanduser() / "config.json").read_text()).get("id2label") or {}
    except (OSError, ValueError):
        return []
    return [str(id2label.get(str(i), f"class_{i}")) for i in range(len(id2label))]


def load_hf_classifier(value: str, weights: str | None) -> tuple[Any, dict[str, Any], list[str]]:
    """The network (pixels -> logits, eval mode, eager attention: the TorchScript exporter traces
    it), the manifest's source record and the config's labels."""
    import transformers
    from torch import nn

    if weights:
        raise InvalidSpecError(f"--weights does not apply to a Hugging Face checkpoint ({value} holds its own)")
    path = Path(value).expanduser().resolve()
    try:
        model = transformers.AutoModelForImageClassification.from_pretrained(str(path), attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - any loading failure: one line
        raise ModelLoadError(f"cannot load {path} as an image classifier: {one_line(exc, 300)}") from None

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixels: Any) -> Any:
            return self.model(pixel_values=pixels).logits

    labels = config_labels(str(path))
    file = next((f for f in ("model.safetensors", "pytorch_model.bin") if (path / f).is_file()), None)
    record = {
        "kind": "huggingface",
        "id": path.name,
        "revision": f"transformers=={transformers.__version__}",
        "weights_sha256": sha256_file(path / file) if file else None,
    }
    return Logits().eval(), record, labels
