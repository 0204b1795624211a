"""Export a torchvision image classifier with its preprocessing and softmax in the graph.

Input: a torchvision model name (`TORCHVISION_MODELS`), weights from a local state-dict file
(safetensors, or a torch file read with `weights_only=True`) or random initialisation, and an
optional labels file (one label per line; default: the weights' ImageNet categories).

Output graph: `images` uint8 `[batch, height, width, 3]` (RGB, any size; all images of a batch
share one size) to `probabilities` float32 `[batch, classes]`. Inside: resize of the shorter side
(antialiased, bilinear or bicubic as the weights' transforms say), centre crop, scale to [0, 1],
normalise, the model, softmax. It is built from two graphs joined by `onnx.compose`: the
preprocessing (exported with the dynamo exporter, the one that exports antialiased resizing, node
names prefixed `pre/`) and the network (the TorchScript exporter, prefixed `net/`), so later steps
can keep preprocessing in fp32 when they quantize the network.

What this does not do: models outside torchvision, or detection/segmentation heads.
"""

from __future__ import annotations

import logging
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from components.core.artifacts import ExportResult
from components.core.errors import ExportError, InvalidSpecError, ModelLoadError
from components.core.exporters.registry import register_exporter
from components.core.sources import TORCHVISION_MODELS
from components.core.specs import ExportSpec
from components.core.timing import measure_latency
from components.core.validation_data import ImageSpec, render_image, validation_images

log = logging.getLogger("ortpack.export")

INPUT_NAME, PIXELS_NAME, OUTPUT_NAME = "images", "pixels", "probabilities"
OPSET = 18  # antialiased Resize needs opset 18
BENCH_SHAPES = {"b1_480x640": (1, 480, 640), "b8_480x640": (8, 480, 640)}


class ImagePreprocess(nn.Module):
    """uint8 `[N, H, W, 3]` to the network's normalised float `[N, 3, crop, crop]`.

    The same steps as torchvision's `Resize(resize_size, antialias=True)`, `CenterCrop(crop_size)`
    and `Normalize(mean, std)`, written without branching on the image size so one graph takes
    every size: the shorter side becomes `resize_size` (the longer `floor(long * resize / short)`),
    and the crop offset reproduces Python's round-half-to-even. The resize runs in float, where
    torchvision's uint8 kernel uses fixed-point arithmetic: results agree within one uint8 level.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        resize_size: int,
        crop_size: int,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        interpolation: str = "bilinear",
    ) -> None:
        super().__init__()
        self.resize_size, self.crop_size, self.interpolation = resize_size, crop_size, interpolation
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).to(torch.float32)
        height, width = x.shape[-2], x.shape[-1]
        short = torch.sym_min(height, width)
        new_h, new_w = height * self.resize_size // short, width * self.resize_size // short
        # torchvision's uint8 kernel (Pillow's algorithm) resizes horizontally, rounds and saturates
        # to uint8, then resizes vertically: two one-dimensional passes with the same rounding
        # reproduce it (a single float pass differs by up to 6 levels on noise with bicubic).
        x = self._resize(x, height, new_w)
        x = self._resize(x, new_h, new_w)
        dh, dw = new_h - self.crop_size, new_w - self.crop_size
        top = (dh + ((dh // 2) % 2) * (dh % 2)) // 2  # round(dh / 2), half to even, like CenterCrop
        left = (dw + ((dw // 2) % 2) * (dw % 2)) // 2
        x = x[:, :, top : top + self.crop_size, left : left + self.crop_size]
        return (x - self.mean) / self.std

    def _resize(self, x: torch.Tensor, height: Any, width: Any) -> torch.Tensor:
        x = nn.functional.interpolate(
            x, size=(height, width), mode=self.interpolation, antialias=True, align_corners=False
        )
        return torch.floor(x + 0.5).clamp(0.0, 255.0)  # round half up, saturate: uint8 semantics


class Classifier(nn.Module):
    """The network followed by softmax: probabilities, not logits, leave the graph."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.network(pixels), dim=1)


def preprocessing_spec(spec: ExportSpec) -> dict[str, Any]:
    """Resize, crop, mean, std and interpolation: the weights' own transforms, then flags."""
    from torchvision.models import get_model_weights

    transforms = get_model_weights(spec.source).DEFAULT.transforms()
    interpolation = str(transforms.interpolation.value)
    if interpolation not in ("bilinear", "bicubic"):
        raise ExportError(f"{spec.source} uses {interpolation} resizing; ortpack exports bilinear and bicubic")
    return {
        "resize_size": spec.resize_size or int(transforms.resize_size[0]),
        "crop_size": spec.crop_size or int(transforms.crop_size[0]),
        "mean": tuple(float(v) for v in (spec.mean or transforms.mean)),
        "std": tuple(float(v) for v in (spec.std or transforms.std)),
        "interpolation": interpolation,
    }


def load_network(name: str, weights: str | None) -> tuple[nn.Module, str | None]:
    """The torchvision model, randomly initialised or with a local state dict; never unpickled."""
    import torchvision

    if name not in TORCHVISION_MODELS:
        raise InvalidSpecError(f"unknown image model {name!r} (supported: {', '.join(TORCHVISION_MODELS)})")
    network = torchvision.models.get_model(name, weights=None)
    if weights is None:
        log.warning("export: %s has random weights (no --weights given)", name)
        return network.eval(), None
    path = Path(weights)
    if not path.is_file():
        raise ModelLoadError(f"weights file not found: {weights}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        network.load_state_dict(state, strict=True)
    except Exception as exc:  # noqa: BLE001 - corrupt, pickled or mismatched weights: one line
        text = " ".join(str(exc).split())[:300]
        raise ModelLoadError(f"cannot load weights from {weights} into {name}: {text}") from None
    from serving.bundle import sha256_file

    return network.eval(), sha256_file(path)


def read_labels(labels: str | None, name: str, classes: int) -> list[str]:
    if labels is None:
        from torchvision.models import get_model_weights

        categories = list(get_model_weights(name).DEFAULT.meta.get("categories", []))
        return categories if len(categories) == classes else [f"class_{i}" for i in range(classes)]
    path = Path(labels)
    if not path.is_file():
        raise ModelLoadError(f"labels file not found: {labels}")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(lines) != classes:
        raise ModelLoadError(f"{labels} has {len(lines)} labels; {name} has {classes} classes")
    return lines


def reference_transform(pre: dict[str, Any]) -> Any:
    """torchvision's own pipeline on uint8 tensors: what the graph must reproduce."""
    from torchvision.transforms import v2

    mode = v2.InterpolationMode(pre["interpolation"])
    return v2.Compose(
        [v2.Resize(pre["resize_size"], interpolation=mode, antialias=True), v2.CenterCrop(pre["crop_size"])]
    )


def export_graphs(preprocess: ImagePreprocess, classifier: Classifier, out_dir: Path, crop: int) -> None:
    """preprocess.onnx (dynamo), network (TorchScript), and model.onnx, the two composed."""
    import onnx
    from onnx import compose

    sample = torch.randint(0, 256, (2, 300, 400, 3), dtype=torch.uint8)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("height", min=2), 2: torch.export.Dim("width", min=2)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            preprocess,
            (sample,),
            dynamo=True,
            opset_version=OPSET,
            dynamic_shapes=(dims,),
            input_names=[INPUT_NAME],
            output_names=[PIXELS_NAME],
            verbose=False,
        )
        assert program is not None
        program.save(str(out_dir / "preprocess.onnx"))
        torch.onnx.export(
            classifier,
            (torch.randn(2, 3, crop, crop),),
            str(out_dir / "network.onnx"),
            dynamo=False,
            opset_version=OPSET,
            input_names=[PIXELS_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={PIXELS_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )
    pre = onnx.load(str(out_dir / "preprocess.onnx"))
    net = onnx.load(str(out_dir / "network.onnx"))
    net = onnx.version_converter.convert_version(net, OPSET) if net.opset_import[0].version != OPSET else net
    pre.ir_version = net.ir_version = min(pre.ir_version, net.ir_version)
    keep = {"rename_inputs": False, "rename_outputs": False}
    pre = compose.add_prefix(pre, "pre/", **keep)
    net = compose.add_prefix(net, "net/", **keep)
    model = compose.merge_models(pre, net, io_map=[(PIXELS_NAME, PIXELS_NAME)])
    opsets: dict[str, int] = {}  # merge_models lists each graph's opset imports: one per domain is the valid form
    for imp in model.opset_import:
        opsets[imp.domain] = max(opsets.get(imp.domain, 0), imp.version)
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(out_dir / "model.onnx"))
    (out_dir / "network.onnx").unlink()


@torch.inference_mode()
def reference_outputs(
    classifier: Classifier, pre: dict[str, Any], specs: tuple[ImageSpec, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """torchvision-preprocessed pixels (uint8 [N, 3, crop, crop]) and PyTorch probabilities."""
    transform = reference_transform(pre)
    mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
    pixels = np.stack([transform(torch.from_numpy(render_image(s)).permute(2, 0, 1)).numpy() for s in specs])
    probs = []
    for start in range(0, len(pixels), 8):
        batch = torch.from_numpy(pixels[start : start + 8]).float() / 255.0
        probs.append(classifier((batch - mean) / std).numpy())
    return pixels, np.concatenate(probs).astype(np.float32)


@register_exporter("image-classification")
def export_image_classifier(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` (a torchvision model name) into `out_dir`; return what was written."""
    import onnx
    import torchvision

    pre = preprocessing_spec(spec) if spec.source in TORCHVISION_MODELS else None
    network, weights_sha = load_network(spec.source, spec.weights)
    assert pre is not None
    t0 = time.perf_counter()
    preprocess = ImagePreprocess(
        pre["resize_size"], pre["crop_size"], pre["mean"], pre["std"], pre["interpolation"]
    ).eval()
    classifier = Classifier(network).eval()
    with torch.inference_mode():
        classes = int(classifier(torch.zeros(1, 3, pre["crop_size"], pre["crop_size"])).shape[1])
    labels = read_labels(spec.labels, spec.source, classes)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("export: %s to ONNX (opset %d) with preprocessing in the graph", spec.source, OPSET)
    try:
        export_graphs(preprocess, classifier, out_dir, pre["crop_size"])
    except Exception as exc:  # noqa: BLE001
        raise ExportError(f"cannot export {spec.source} to ONNX: {' '.join(str(exc).split())[:300]}") from None
    seconds = time.perf_counter() - t0
    graph = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)

    specs = validation_images()
    log.info("export: PyTorch reference outputs on %d generated images", len(specs))
    pixels, probs = reference_outputs(classifier, pre, specs)
    if not np.isfinite(probs).all():
        raise ExportError("the PyTorch model produces non-finite probabilities on the validation images")
    np.savez_compressed(
        out_dir / "reference.npz",
        task=np.array("image-classification"),
        heights=np.array([s.height for s in specs]),
        widths=np.array([s.width for s in specs]),
        kinds=np.array([s.kind for s in specs]),
        seeds=np.array([s.seed for s in specs]),
        pixels=pixels,
        outputs=probs,
        input_names=np.array([INPUT_NAME]),
    )

    log.info("export: measuring PyTorch eager latency (torchvision transforms + model)")
    transform = reference_transform(pre)
    mean, std = torch.tensor(pre["mean"]).view(1, 3, 1, 1), torch.tensor(pre["std"]).view(1, 3, 1, 1)

    def torch_call(batch: torch.Tensor) -> torch.Tensor:
        x = transform(batch.permute(0, 3, 1, 2)).float() / 255.0
        return classifier((x - mean) / std)

    torch_latency = {}
    with torch.inference_mode():
        for key, (n, h, w) in BENCH_SHAPES.items():
            batch = torch.from_numpy(np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)]))
            torch_latency[key] = measure_latency(partial(torch_call, batch), budget_s=3.0)

    result = ExportResult(
        task="image-classification",
        name=spec.name,
        source={
            "kind": "torchvision",
            "id": spec.source,
            "revision": f"torchvision=={torchvision.__version__}",
            "weights_sha256": weights_sha,
        },
        inputs=[{"name": INPUT_NAME, "dtype": "uint8", "shape": ["batch", "height", "width", 3]}],
        outputs=[{"name": OUTPUT_NAME, "dtype": "float32", "shape": ["batch", classes]}],
        opset=OPSET,
        model_info={"model_type": spec.source, "classes": classes, "crop_size": pre["crop_size"]},
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": (out_dir / "model.onnx").stat().st_size / 1e6,
            "seconds": seconds,
            "validation_samples": float(len(specs)),
        },
        torch_latency=torch_latency,
        versions={"torch": torch.__version__, "torchvision": torchvision.__version__, "onnx": onnx.__version__},
        preprocessing={
            "input_dtype": "uint8",
            "layout": "NHWC",
            "value_range": [0, 255],
            "color": "RGB",
            "resize_size": pre["resize_size"],
            "crop_size": pre["crop_size"],
            "interpolation": pre["interpolation"],
            "antialias": True,
            "mean": list(pre["mean"]),
            "std": list(pre["std"]),
        },
        labels=labels,
        extra_files=[],
    )
    result.save(out_dir)
    return result
