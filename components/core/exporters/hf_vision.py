"""Hugging Face vision encoders as image embedders: a local checkpoint directory (config.json,
the weights, preprocessor_config.json) of ViT, DINOv2, ConvNeXt, or the image tower of CLIP or
SigLIP, pooled as its model card says.

| model_type | loaded as | vector |
|---|---|---|
| `dinov2`, `vit` | Dinov2Model, ViTModel | the CLS token of the last (layer-normed) hidden state |
| `convnext` | ConvNextModel | `pooler_output`: the mean of the last stage, layer-normed |
| `clip`, `clip_vision_model` | CLIPVisionModelWithProjection | `image_embeds`: the projection, CLIP's shared space |
| `siglip`, `siglip_vision_model` | SiglipVisionModel | `pooler_output`: the attention-pooling head |

The preprocessing comes from preprocessor_config.json when it is the graph's own (the shorter
side resized, then a centre crop: CLIP, DINOv2, ConvNeXt below 384 px); a processor that resizes
to a fixed height and width (ViT, SigLIP: it stretches the image) is refused unless
`--resize-size` and `--crop-size` say which shorter-side resize and crop to use instead (an index
built with Hugging Face's own processor would then not match). Reading the config needs no torch;
`load_hf_vision` imports transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortpack.components.core.errors import InvalidSpecError, ModelLoadError
from ortpack.kernel.errors import one_line

# model_type -> (transformers class, pooling)
MODELS = {
    "dinov2": ("Dinov2Model", "cls"),
    "vit": ("ViTModel", "cls"),
    "convnext": ("ConvNextModel", "mean"),
    "clip": ("CLIPVisionModelWithProjection", "projection"),
    "clip_vision_model": ("CLIPVisionModelWithProjection", "projection"),
    "siglip": ("SiglipVisionModel", "attention"),
    "siglip_vision_model": ("SiglipVisionModel", "attention"),
}
RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's codes, as the processors store them


def checkpoint_model_type(value: str) -> str | None:
    """The model_type in a local checkpoint directory's config.json ("" when it names none), or
    None when `value` has no config.json; an unreadable config is one ModelLoadError line."""
    config = Path(value).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        return str(json.loads(config.read_text()).get("model_type", ""))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config}: {exc}") from None


# what a checkpoint's config.json `architectures` class names say it is, and which task takes it
HEADS = (
    ("ForSemanticSegmentation", "a semantic segmenter: give --task semantic-segmentation"),
    ("ForImageClassification", "an image classifier: give --task image-classification"),
    ("ForObjectDetection", "an object detector: give --task object-detection"),
)


def other_head(value: str, own: str) -> str | None:
    """What the checkpoint is when its config's architectures name a head other than `own` (a
    class-name suffix of `HEADS`), with the task to give; None when they name `own` or no head.
    SegFormer is both an image classifier and a segmenter in transformers' tables: the checkpoint's
    own head decides."""
    try:
        names = json.loads((Path(value).expanduser() / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    if any(str(name).endswith(own) for name in names):
        return None
    for suffix, says in HEADS:
        if any(str(name).endswith(suffix) for name in names):
            return says
    return None


def hf_vision_type(value: str) -> str | None:
    """The model_type of a local Hugging Face vision checkpoint directory, or None when `value`
    is not one (ModelLoadError when it is a checkpoint of a type not served here)."""
    model_type = checkpoint_model_type(value)
    if model_type is None:
        return None
    if model_type not in MODELS:
        raise ModelLoadError(
            f"{value} is a {model_type or 'unknown'} checkpoint; image embeddings take {', '.join(sorted(MODELS))}"
        )
    return model_type


def hf_preprocessing(path: Path, resize_size: int | None, crop_size: int | None) -> dict[str, Any]:
    """The graph's preprocessing from the checkpoint's preprocessor_config.json (see the module)."""
    file = path / "preprocessor_config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path} has no preprocessor_config.json (its resize, crop, mean and std)")
    cfg = json.loads(file.read_text())
    resample = RESAMPLE.get(int(cfg.get("resample", 2)))
    if resample is None:
        raise ModelLoadError(
            f"{file} resamples with PIL code {cfg.get('resample')}; ortpack exports bilinear and bicubic"
        )
    size, crop = cfg.get("size") or {}, cfg.get("crop_size") or {}
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    if shortest and cfg.get("do_center_crop", False) and crop:
        resize, cropped = int(shortest), int(crop["height"])
    elif shortest and "crop_pct" in cfg and shortest < 384:  # ConvNeXt: resize to size / crop_pct, crop size
        resize, cropped = int(shortest / float(cfg["crop_pct"])), int(shortest)
    elif not (resize_size and crop_size):
        raise InvalidSpecError(
            f"{file} resizes every image to a fixed {size} (stretching it); the graph resizes the shorter side "
            "and centre-crops: give --resize-size and --crop-size to use that instead"
        )
    else:
        resize, cropped = resize_size, crop_size
    return {
        "resize_size": resize_size or resize,
        "crop_size": crop_size or cropped,
        "mean": tuple(float(v) for v in cfg["image_mean"]),
        "std": tuple(float(v) for v in cfg["image_std"]),
        "interpolation": resample,
    }


def load_hf_vision(path: Path, model_type: str) -> tuple[Any, str]:
    """The encoder (eval mode, eager attention: the TorchScript exporter traces it) returning one
    pooled vector per image, and its pooling's name."""
    import transformers
    from torch import nn

    class_name, pooling = MODELS[model_type]
    try:
        model = getattr(transformers, class_name).from_pretrained(str(path), attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - any loading failure: one line
        raise ModelLoadError(f"cannot load {path} as {class_name}: {one_line(exc, 300)}") from None

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixels: Any) -> Any:
            out = self.model(pixel_values=pixels)
            if pooling == "projection":
                return out.image_embeds
            if pooling == "cls":
                return out.last_hidden_state[:, 0]
            return out.pooler_output.flatten(1)

    return Pooled().eval(), pooling
