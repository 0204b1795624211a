"""timm (PyTorch Image Models) architectures by name: `--model timm:NAME`.

    --model timm:resnet50                   timm.create_model("resnet50"), its pretrained_cfg's
    --model timm:vit_small_patch16_224.augreg_in21k_ft_in1k   ...or a tagged config

The weights come from `--weights` (a state_dict: safetensors, or a torch file read with
`weights_only=True`), as timm's own `pretrained_cfg` files hold them; nothing is downloaded
(`pretrained=False`). A checkpoint with another number of classes than the config's builds a
head of that size (the state_dict's classifier tells it).

Preprocessing is the model's own data config (`timm.data.resolve_data_config`): the input size,
`crop_pct` (the shorter side resized to floor(size / crop_pct), then the centre crop), the
interpolation and the mean and std; `--resize-size`, `--crop-size`, `--mean` and `--std`
override it. A config the graph cannot reproduce exactly (a `crop_mode` other than `center`, a
non-square input, nearest or lanczos resizing) is refused in one line.

Labels: ImageNet's (timm's `ImageNetInfo`: 1k or the 21k subsets) when the classes match one,
else class_N. Embeddings: the pooled features before the classifier (`reset_classifier(0)`,
what `forward_head(..., pre_logits=True)` returns).
"""

from __future__ import annotations

import math
from typing import Any

from ortpack.components.core.errors import ModelLoadError, did_you_mean, one_line

PREFIX = "timm:"


def is_timm(value: str) -> bool:
    return value.startswith(PREFIX)


def timm_name(value: str) -> str:
    """The architecture (with its tag, if any) a `timm:NAME` value names; refused in one line
    when timm does not know it (with the nearest names)."""
    import timm

    name = value[len(PREFIX) :].strip()
    architecture = name.split(".", 1)[0]
    if not name or not timm.is_model(architecture):
        known = timm.list_models()
        hint = did_you_mean(architecture, known)
        raise ModelLoadError(
            f"timm has no model {name!r}{hint} (timm {timm.__version__} knows {len(known)}: "
            "python -c 'import timm; print(timm.list_models(\"*vit*\"))')"
        )
    if "." in name and not _known_tag(name):
        tags = timm.list_pretrained(f"{architecture}.*")
        raise ModelLoadError(f"timm has no config {name!r}; {architecture} has {', '.join(tags) or 'none'}")
    return name


def timm_preprocessing(value: str) -> dict[str, Any]:
    """The graph's resize, crop, interpolation, mean and std from the model's data config."""
    from timm.data import resolve_data_config

    name = timm_name(value)
    cfg = _pretrained_cfg(name)
    data = resolve_data_config(pretrained_cfg=cfg, use_test_size=False)
    _, height, width = data["input_size"]
    if height != width:
        raise ModelLoadError(f"timm:{name} takes {height}x{width} inputs; the graph centre-crops a square")
    if data.get("crop_mode", "center") != "center":
        raise ModelLoadError(
            f"timm:{name} crops with crop_mode={data['crop_mode']!r}; the graph resizes the shorter side and "
            "centre-crops: give --resize-size and --crop-size to use that instead"
        )
    crop_pct = float(data.get("crop_pct") or 1.0)
    return {
        "resize_size": math.floor(height / crop_pct),  # timm's transforms_factory.transforms_imagenet_eval
        "crop_size": int(height),
        "interpolation": str(data["interpolation"]),
        "mean": tuple(float(v) for v in data["mean"]),
        "std": tuple(float(v) for v in data["std"]),
    }


def load_timm(value: str, state: dict[str, Any] | None) -> Any:
    """The model built by timm without downloading, with a head as wide as the state_dict's."""
    import timm

    name = timm_name(value)
    kwargs: dict[str, Any] = {}
    classes = _state_classes(name, state) if state is not None else None
    if classes is not None:
        kwargs["num_classes"] = classes
    try:
        return timm.create_model(name, pretrained=False, **kwargs)
    except Exception as exc:  # noqa: BLE001 - timm refused the config: one line
        raise ModelLoadError(f"timm cannot build {name}: {type(exc).__name__}: {one_line(exc, 200)}") from None


def timm_labels(classes: int) -> list[str] | None:
    """ImageNet's label descriptions when `classes` is one of timm's ImageNet subsets (1k, 21k...)."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset({"num_classes": classes})
    if subset is None:
        return None
    labels = [str(label) for label in ImageNetInfo(subset).label_descriptions(as_dict=False)]
    return labels if len(labels) == classes else None


def drop_timm_head(network: Any) -> str:
    """timm's own way to take pooled features: the classifier replaced by the identity."""
    head = network.default_cfg.get("classifier", "classifier")
    network.reset_classifier(0)
    return str(head)


def _known_tag(name: str) -> bool:
    import timm

    try:
        return timm.get_pretrained_cfg(name) is not None
    except RuntimeError:  # "Invalid pretrained tag"
        return False


def _pretrained_cfg(name: str) -> dict[str, Any]:
    import timm

    cfg = timm.get_pretrained_cfg(name)
    if cfg is None:  # an architecture without a registered config: timm's defaults
        return {}
    return dict(cfg.to_dict())


def _state_classes(name: str, state: dict[str, Any]) -> int | None:
    """The classifier width a state_dict holds, where the config names its classifier."""
    classifier = _pretrained_cfg(name).get("classifier")
    if not classifier:
        return None
    heads = classifier if isinstance(classifier, (list, tuple)) else (classifier,)
    for head in heads:
        weight = state.get(f"{head}.weight")
        if weight is not None and getattr(weight, "ndim", 0) >= 1:
            return int(weight.shape[0])
    return None
