"""Where an image classifier comes from: any torchvision classifier, timm or Hugging Face model by
name or directory, your own module, or an exported program.

    --model mobilenet_v2                 a torchvision classification builder: any name
                                         torchvision.models.list_models(module=torchvision.models) lists
    --model timm:convnext_tiny           a timm architecture (timm_models.py), its own data config
    --model CHECKPOINT_DIR               a Hugging Face image classifier (hf_image_classification.py)
    --model my_pkg.models:build_net      a callable that returns a torch.nn.Module, imported from the
                                         current directory or the Python path (your code must be
                                         importable where the export runs: on a cluster, in the
                                         component image)
    --model classifier.pt2               a `torch.export` ExportedProgram (`torch.export.save`):
                                         self-contained, so it works as a model URI on a cluster

`--weights` is a state_dict for torchvision, timm and your own module (safetensors, or a torch file
loaded with `weights_only=True`: never unpickled), loaded strictly; a .pt2 and a Hugging Face
checkpoint carry their own. Every model must take one float tensor `[batch, 3, H, W]` (normalised
pixels, any batch size) and return logits `[batch, classes]`; that is checked on a small batch
before export, in one line when it fails.

Preprocessing: a torchvision model's weights enum names its transforms: the entry whose file
`--weights` is (by its file name, or the sha256 prefix torchvision's file names carry), else the
builder's DEFAULT entry; a timm model's data config; a Hugging Face checkpoint's
preprocessor_config.json; ImageNet's defaults for the others (resize 256, crop 224, bilinear,
ImageNet mean and std). --resize-size, --crop-size, --mean and --std override any of them.
Labels follow the same entries: torchvision's categories, timm's ImageNet subsets, the config's
id2label, else class_N.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortpack.components.core.errors import InvalidSpecError, ModelLoadError, did_you_mean, one_line
from ortpack.components.core.exporters import hf_image_classification, timm_models
from ortpack.components.core.exporters.hf_vision import hf_preprocessing
from ortpack.kernel.bundle import sha256_file

log = logging.getLogger("ortpack.export")

FACTORY = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")
PROGRAM_SUFFIX = ".pt2"
# torchvision's weight files end with the first hex digits of their sha256
TORCHVISION_HASH = re.compile(r"-(?P<hash>[0-9a-f]{8,})\.pth$")
IMAGENET = {"resize_size": 256, "crop_size": 224, "interpolation": "bilinear",
            "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}  # fmt: skip
MISMATCH_SHOWN = 3  # keys named in a state_dict mismatch
# Factory names that say nothing of the model: a bundle is named after the factory's module instead
GENERIC_FACTORIES = {"build", "create", "make", "model", "get_model", "load", "load_model", "build_model",
                     "create_model", "make_model", "factory", "main", "net", "network", "get_net"}  # fmt: skip


@dataclass(frozen=True)
class ImageSource:
    kind: str  # "torchvision", "timm", "huggingface", "factory" or "program"
    value: str  # the name, `timm:NAME`, the checkpoint directory, `module:attr`, or the .pt2 path

    @property
    def default_name(self) -> str:
        """The bundle's name unless `--name` gives one: a torchvision name, a program's file name,
        or a factory's name, or its module's when the factory is called like every factory
        (`lite0:build` -> `lite0`, `my_models.effnet:efficientnet_lite0` -> `efficientnet_lite0`)."""
        if self.kind == "factory":
            module, _, factory = self.value.rpartition(":")
            return module.rpartition(".")[2] if factory.lower() in GENERIC_FACTORIES else factory
        if self.kind == "program":
            return Path(self.value).name.removesuffix(PROGRAM_SUFFIX)
        if self.kind == "huggingface":
            return Path(self.value).name
        if self.kind == "timm":
            return self.value[len(timm_models.PREFIX) :]
        return self.value


def torchvision_classifiers() -> list[str]:
    """Every classification builder torchvision has (not its detection, segmentation, video,
    optical-flow or quantized ones)."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models))


def parse_image_source(value: str, *, local: bool = True) -> ImageSource:
    """What `--model` names for image classification; `local` checks that a .pt2 path exists and a
    factory's module can be found here (a submitted run finds them in the cluster's image)."""
    if timm_models.is_timm(value):
        if local:
            timm_models.timm_name(value)
        return ImageSource("timm", value.strip())
    if value in torchvision_classifiers():
        return ImageSource("torchvision", value)
    if "://" not in value and hf_image_classification.hf_classifier_type(value) is not None:
        return ImageSource("huggingface", str(Path(value).expanduser().resolve()) if local else value)
    if is_factory(value, local=local):
        return ImageSource("factory", value)
    if value.endswith(PROGRAM_SUFFIX):
        if "://" in value:
            return ImageSource("program", value)
        path = Path(value).expanduser()
        if local and not path.is_file():
            raise ModelLoadError(f"exported program not found: {value}")
        return ImageSource("program", str(path.resolve()) if local else value)
    known = torchvision_classifiers()
    raise ModelLoadError(
        f"unknown image model {value!r}{did_you_mean(value, known)}: give a torchvision classifier "
        f"({len(known)} names: torchvision.models.list_models()), timm:NAME, a Hugging Face checkpoint "
        "directory, your own module as PACKAGE.MODULE:FACTORY, or a torch.export program FILE.pt2"
    )


def load_image_network(source: ImageSource, weights: str | None, crop_size: int) -> tuple[Any, dict[str, Any]]:
    """The network in eval mode and the manifest's source record (kind, id, weights sha256),
    after checking that it takes `[batch, 3, crop, crop]` floats and returns `[batch, classes]`."""

    if source.kind == "huggingface":
        network, record, _ = hf_image_classification.load_hf_classifier(source.value, weights)
        network.eval()
        _check_signature(network, source, crop_size)
        return network, record
    if source.kind == "program" and weights:
        raise InvalidSpecError(f"--weights does not apply to an exported program ({source.value} holds its own)")
    state = read_state(weights) if weights else None
    if source.kind == "torchvision":
        import torchvision

        network = torchvision.models.get_model(source.value, weights=None)
        revision = f"torchvision=={torchvision.__version__}"
    elif source.kind == "timm":
        import timm

        network = timm_models.load_timm(source.value, state)
        revision = f"timm=={timm.__version__}"
    elif source.kind == "factory":
        network = call_factory(source.value)
        revision = ""
    else:
        network = load_program(source.value)
        revision = f"sha256:{sha256_file(Path(source.value))}"
    weights_sha = None
    if weights and state is not None:
        load_state(network, state, weights, source.value)
        weights_sha = sha256_file(Path(weights))
    elif source.kind != "program":
        log.warning("export: %s has random weights (no --weights given)", source.value)
    if hasattr(network, "eval"):
        network.eval()
    _check_signature(network, source, crop_size)
    record = {"kind": source.kind, "id": source.value, "revision": revision, "weights_sha256": weights_sha}
    if source.kind == "program":
        record["id"] = Path(source.value).name
    return network, record


def call_factory(value: str) -> Any:
    from torch import nn

    module_name, _, attr = value.partition(":")
    current_directory_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelLoadError(f"cannot import {module_name!r} (from --model {value}): {one_line(exc, 200)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing: one line
        raise ModelLoadError(f"importing {module_name!r} failed: {type(exc).__name__}: {one_line(exc, 200)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelLoadError(f"{module_name!r} has no callable {attr!r} (from --model {value})")
    try:
        network = factory()
    except Exception as exc:  # noqa: BLE001 - the user's factory failed: one line
        raise ModelLoadError(f"{value}() failed: {type(exc).__name__}: {one_line(exc, 200)}") from None
    if not isinstance(network, nn.Module):
        raise ModelLoadError(f"{value}() returned a {type(network).__name__}, not a torch.nn.Module")
    return network


def is_factory(value: str, *, local: bool = True) -> bool:
    """Whether `value` names your own module's factory (`PACKAGE.MODULE:FACTORY`, every task's
    `--model`); `local` checks that its module can be found here (one ModelLoadError line)."""
    match = FACTORY.match(value)
    if not match:
        return False
    current_directory_importable()
    if local and importlib.util.find_spec(match["module"].partition(".")[0]) is None:
        raise ModelLoadError(
            f"cannot import {match['module']!r} (from --model {value}): no such module on the Python path; "
            "run from the directory that holds it or add it to PYTHONPATH"
        )
    return True


def current_directory_importable() -> None:
    """Modules in the current directory import, as with `python -m` (and uvicorn's APP:FACTORY):
    a console script's path starts at its own bin directory instead."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def load_program(path: str) -> Any:
    import torch

    try:
        program = torch.export.load(path)
    except Exception as exc:  # noqa: BLE001 - not a .pt2 archive, or another torch's: one line
        raise ModelLoadError(
            f"cannot load the exported program {path}: {type(exc).__name__}: {one_line(exc, 200)}"
        ) from None
    return _wrap_program(program.module())


def _wrap_program(module: Any) -> Any:
    """An exported program's module behind a wrapper: its train/eval mode was fixed when it was
    exported (its own train() and eval() raise), so switching modes stops at the wrapper."""
    from torch import nn

    class ExportedProgramModule(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.program = module

        def train(self, mode: bool = True) -> ExportedProgramModule:
            return self

        def forward(self, x: Any) -> Any:
            return self.program(x)

    return ExportedProgramModule()


def load_weights(network: Any, weights: str, model: str) -> None:
    """Load a state_dict file into `network` strictly (`read_state`, `load_state`)."""
    load_state(network, read_state(weights), weights, model)


def read_state(weights: str) -> dict[str, Any]:
    """A state_dict from safetensors or a torch file read with `weights_only=True`."""
    import torch

    path = Path(weights)
    if not path.is_file():
        raise ModelLoadError(f"weights file not found: {weights}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt or pickled beyond tensors: one line
        raise ModelLoadError(f"cannot read weights from {weights}: {one_line(exc, 200)}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"{weights} is not a state_dict (a mapping of parameter names to tensors)")
    return state


def load_state(network: Any, state: dict[str, Any], weights: str, model: str) -> None:
    """`state` into `network`, every key and shape matching (else one line naming the first few)."""
    expected = network.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} missing ({', '.join(missing[:MISMATCH_SHOWN])}{', ...' * (len(missing) > 3)})"
            )
        if unexpected:
            shown = ", ".join(unexpected[:MISMATCH_SHOWN])
            parts.append(f"{len(unexpected)} unexpected ({shown}{', ...' * (len(unexpected) > 3)})")
        raise ModelLoadError(f"{weights} does not match {model}: {'; '.join(parts)}")
    shapes = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if shapes:
        k = shapes[0]
        raise ModelLoadError(
            f"{weights} does not match {model}: {k} is {tuple(state[k].shape)} in the file, "
            f"{tuple(expected[k].shape)} in the model ({len(shapes)} such)"
        )
    if getattr(state, "_metadata", None) is None:
        # a safetensors file (or a plain dict) has no module versions, and some modules refuse to
        # load without one (torchvision's MNASNet: "version should be set to 1 or 2"): the
        # network's own, the versions of the code it was built with
        state = OrderedDict(state)
        state._metadata = getattr(network.state_dict(), "_metadata", None)  # type: ignore[attr-defined]
    network.load_state_dict(state, strict=True)


def _check_signature(network: Any, source: ImageSource, crop: int) -> None:
    import torch

    try:
        with torch.inference_mode():
            out = network(torch.zeros(2, 3, crop, crop))
    except Exception as exc:  # noqa: BLE001 - the model refused the input: say what it must take
        how = (
            " (export it with a dynamic batch: torch.export.export(model, (x,), dynamic_shapes=({0: Dim('batch')},)))"
            if source.kind == "program"
            else ""
        )
        raise ModelLoadError(
            f"{source.value} must take one float tensor [batch, 3, {crop}, {crop}]{how}: "
            f"{type(exc).__name__}: {one_line(exc, 200)}"
        ) from None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelLoadError(
            f"{source.value} must return logits [batch, classes]; it returned {shape} for a batch of 2"
        )


def torchvision_weights(name: str, weights: str | None) -> Any:
    """The entry of the builder's weights enum that `weights` is: the same file name, or the
    sha256 prefix torchvision's file names end with (`resnet50-11ad3fa6.pth`); else DEFAULT."""
    from torchvision.models import get_model_weights

    entries = get_model_weights(name)
    if weights:
        path = Path(weights)
        by_name = [e for e in entries if Path(e.url).name == path.name or Path(e.url).stem == path.stem]
        if by_name:
            return by_name[0]
        digest = ""
        for entry in entries:
            match = TORCHVISION_HASH.search(Path(entry.url).name)
            if match and path.is_file():
                digest = digest or sha256_file(path)
                if digest.startswith(match["hash"]):
                    return entry
    return entries.DEFAULT


def default_preprocessing(
    source: ImageSource, weights: str | None = None, resize_size: int | None = None, crop_size: int | None = None
) -> dict[str, Any]:
    """The model's own preprocessing (see the module): a torchvision weights entry's transforms,
    a timm data config, a Hugging Face processor's (`resize_size` and `crop_size` stand in for
    one that stretches), else ImageNet's defaults."""
    if source.kind == "timm":
        return timm_models.timm_preprocessing(source.value)
    if source.kind == "huggingface":
        return hf_preprocessing(Path(source.value).expanduser(), resize_size, crop_size)
    if source.kind != "torchvision":
        return dict(IMAGENET)
    transforms = torchvision_weights(source.value, weights).transforms()
    return {
        "resize_size": int(transforms.resize_size[0]),
        "crop_size": int(transforms.crop_size[0]),
        "interpolation": str(transforms.interpolation.value),
        "mean": tuple(float(v) for v in transforms.mean),
        "std": tuple(float(v) for v in transforms.std),
    }


def default_labels(source: ImageSource, classes: int, weights: str | None = None) -> list[str]:
    """The model's own labels (see the module) when it has that many classes, else class_N."""
    labels: list[str] | None = None
    if source.kind == "torchvision":
        labels = list(torchvision_weights(source.value, weights).meta.get("categories", []))
    elif source.kind == "timm":
        labels = timm_models.timm_labels(classes)
    elif source.kind == "huggingface":
        labels = hf_image_classification.config_labels(source.value)
    if labels and len(labels) == classes:
        return labels
    return [f"class_{i}" for i in range(classes)]
