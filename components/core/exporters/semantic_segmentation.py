"""Export a semantic segmenter with its whole path in the graph: raw uint8 `images` `[batch,
height, width, 3]` (RGB, any size; a batch's images share one) in, `label_map` uint8 `[batch,
height, width]` out, one class index per pixel of the image as it was sent.

Inside: the resize (the shorter side to the model's size, or both sides to it; antialiased, as
torchvision's uint8 kernel: image_common.ImagePreprocess), normalisation, the network, its logits
resized back to the image (bilinear, half-pixel centres, as `F.interpolate(align_corners=False)`
and transformers' `post_process_semantic_segmentation`), and the argmax over classes.

Three kinds of segmenter (`parse_segmentation_source`):

- torchvision's segmentation builders by name (`segmentation_builders()`: DeepLabV3 with
  MobileNetV3 or ResNet-50/101, FCN ResNet-50/101, LR-ASPP MobileNetV3), `--weights` a state_dict
  (an auxiliary head in it is loaded and unused), preprocessing and the 21 VOC categories from the
  weights enum (`SemanticSegmentation(resize_size=520)`: the shorter side to 520);
- a Hugging Face checkpoint directory `AutoModelForSemanticSegmentation` loads (SegFormer, UperNet,
  MobileViT/MobileViTV2-DeepLab, DPT, BEiT, Data2VecVision, ...), its `logits`, labels from
  `id2label`, preprocessing from preprocessor_config.json: `size` {height, width} (square) is
  "fixed", {shortest_edge} is "shorter"; a processor's centre crop is not applied (a map covers the
  whole photo), BGR input (MobileViT's `do_flip_channel_order`) is flipped inside the network;
- your own module (`PACKAGE.MODULE:FACTORY`) returning logits `[batch, classes, h, w]` (or
  torchvision's `{"out": ...}`), with torchvision's defaults unless flags say otherwise.

The reference is PyTorch on each validation file as the server would get it (Pillow's full
decode): torchvision's resize on uint8, the network, `F.interpolate` back to the image, the argmax,
and the pixels PyTorch classifies decisively (its top class leads by `DECISIVE_MARGIN` in
probability); with a batch of same-size crops of the largest file. The logits are resized a few
classes at a time, so a 12-megapixel photo with 150 classes never holds all its logits at once.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError, InvalidSpecError, ModelLoadError, did_you_mean
from ortpack.components.core.exporters.hf_vision import RESAMPLE, checkpoint_model_type, other_head
from ortpack.components.core.exporters.image_common import (
    MIN_OPSET,
    batch_group,
    export_graphs,
    format_of,
    labels_for,
    reference_decode,
    validation_files,
)
from ortpack.components.core.exporters.image_models import (
    IMAGENET,
    call_factory,
    is_factory,
    load_state,
    read_state,
    torchvision_weights,
)
from ortpack.components.core.reference import REFERENCE_FILE, Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import measure_latency
from ortpack.components.core.validation_data import (
    CALIBRATION_FILE,
    ImageSpec,
    pack_files,
    read_image_files,
    render_image,
)
from ortpack.kernel.bundle import sha256_file
from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.contracts.semantic_segmentation import (
    MAX_CLASSES,
    OUTPUT,
    SIGNATURE,
    SegmentationOptions,
)
from ortpack.kernel.contracts.tensors import BATCH, Tensor
from ortpack.kernel.errors import one_line
from ortpack.kernel.gates import DECISIVE_MARGIN

log = logging.getLogger("ortpack.export")

LOGITS = Tensor("logits", "float32", (BATCH, "classes", "logit_height", "logit_width"))
BENCH_SHAPES = {"b1_480x640": (1, 480, 640), "b4_480x640": (4, 480, 640)}
CLASS_CHUNK = 8  # classes resized at once in the reference
TORCHVISION_SIZE = 520  # torchvision's segmentation weights: the shorter side to 520


def segmentation_builders() -> list[str]:
    """Every segmentation builder torchvision lists (random weights unless --weights)."""
    import torchvision

    return list(torchvision.models.list_models(module=torchvision.models.segmentation))


def segmentation_types() -> dict[str, Any]:
    """transformers' model_type -> class name table for semantic segmentation."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES

    return dict(MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES)


def hf_segmenter_type(value: str) -> str | None:
    """The model_type of a local Hugging Face segmentation checkpoint, None when `value` is not a
    checkpoint directory (ModelLoadError when it is one of another kind)."""
    model_type = checkpoint_model_type(value)
    if model_type is None:
        return None
    head = other_head(value, "ForSemanticSegmentation")
    if head is not None:
        raise ModelLoadError(f"{value} holds {head} (its config's architectures name that head)")
    if model_type not in segmentation_types():
        raise ModelLoadError(
            f"{value} is a {model_type or 'unknown'} checkpoint, not one transformers loads as a semantic "
            f"segmenter (AutoModelForSemanticSegmentation: {', '.join(sorted(segmentation_types()))})"
        )
    return model_type


@dataclass(frozen=True)
class SegmentationSource:
    kind: str  # "torchvision", "huggingface" or "factory"
    value: str

    @property
    def default_name(self) -> str:
        if self.kind == "huggingface":
            return Path(self.value).name
        if self.kind == "factory":
            return self.value.partition(":")[2].replace("_", "-")
        return self.value.replace("_", "-")


def parse_segmentation_source(value: str, *, local: bool = True) -> SegmentationSource:
    """What `--model` names for semantic segmentation; `local` checks that a factory's module can
    be found here."""
    if value in segmentation_builders():
        return SegmentationSource("torchvision", value)
    if "://" not in value and hf_segmenter_type(value) is not None:
        return SegmentationSource("huggingface", str(Path(value).expanduser().resolve()) if local else value)
    if is_factory(value, local=local):
        return SegmentationSource("factory", value)
    known = segmentation_builders()
    raise ModelLoadError(
        f"unknown segmentation model {value!r}{did_you_mean(value, known)}: give a torchvision segmentation "
        f"builder ({', '.join(known)}), a Hugging Face segmentation checkpoint directory, or your own module "
        "as PACKAGE.MODULE:FACTORY (returning logits [batch, classes, h, w])"
    )


class Logits(nn.Module):
    """Normalised pixels to the network's logits `[batch, classes, h, w]`, whatever form its
    forward returns them in (a tensor, torchvision's `{"out": ...}`, transformers' `.logits`);
    `flip`: the network takes BGR (the channels reversed first)."""

    def __init__(self, network: nn.Module, *, huggingface: bool = False, flip: bool = False) -> None:
        super().__init__()
        self.network = network
        self.huggingface = huggingface
        self.flip = flip

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        if self.flip:
            pixels = pixels.flip(1)
        out = self.network(pixel_values=pixels) if self.huggingface else self.network(pixels)
        if isinstance(out, dict) and "out" in out:
            out = out["out"]
        elif hasattr(out, "logits"):
            out = out.logits
        if not isinstance(out, torch.Tensor) or out.dim() != 4:
            raise ExportError("a segmenter's forward must return logits [batch, classes, h, w] (or {'out': logits})")
        return out


@dataclass(frozen=True)
class Segmenter:
    """What was loaded: the network as `Logits`, its labels (perhaps none), its preprocessing
    (`resize`, `size`, mean, std, interpolation) and the manifest's source record."""

    network: Logits
    labels: list[str]
    preprocessing: dict[str, Any]
    record: dict[str, Any]


def _hf_preprocessing(path: Path) -> tuple[dict[str, Any], bool]:
    """(resize, size, mean, std, interpolation) from preprocessor_config.json, and whether the model
    takes BGR."""
    file = path / "preprocessor_config.json"
    if not file.is_file():
        raise ModelLoadError(f"{path} has no preprocessor_config.json (its resize, mean and std)")
    cfg = json.loads(file.read_text())
    interpolation = RESAMPLE.get(int(cfg.get("resample", 2)))
    if interpolation is None:
        raise ModelLoadError(
            f"{file} resamples with PIL code {cfg.get('resample')}; ortpack exports bilinear and bicubic"
        )
    size = cfg.get("size") or {}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    crop = cfg.get("crop_size") or {}
    if (
        cfg.get("do_center_crop")
        and isinstance(crop, dict)
        and crop.get("height")
        and crop.get("height") == crop.get("width")
    ):
        # a map covers the whole photo: where the processor would crop, the graph stretches to the crop
        resize, side = "fixed", int(crop["height"])
    elif "shortest_edge" in size:
        resize, side = "shorter", int(size["shortest_edge"])
    elif "height" in size and size.get("height") == size.get("width"):
        resize, side = "fixed", int(size["height"])
    else:
        raise ModelLoadError(f"{file} resizes to {size}; ortpack exports a square or shorter-side resize")
    normalize = cfg.get("do_normalize", True)
    mean = tuple(float(v) for v in cfg.get("image_mean", (0.5, 0.5, 0.5))) if normalize else (0.0, 0.0, 0.0)
    std = tuple(float(v) for v in cfg.get("image_std", (0.5, 0.5, 0.5))) if normalize else (1.0, 1.0, 1.0)
    pre = {"resize": resize, "size": side, "mean": mean, "std": std, "interpolation": interpolation}
    return pre, bool(cfg.get("do_flip_channel_order", False))


def _torchvision(name: str, weights: str | None) -> tuple[nn.Module, list[str], dict[str, Any]]:
    import torchvision

    state = read_state(weights) if weights else None
    aux = bool(state) and any(k.startswith("aux_classifier.") for k in state or {})
    kwargs: dict[str, Any] = {"weights": None, "weights_backbone": None}
    if not name.startswith("lraspp"):
        kwargs["aux_loss"] = aux
    network = torchvision.models.get_model(name, **kwargs)
    if state is not None and weights:
        load_state(network, state, weights, name)
    entry = torchvision_weights(name, weights)
    transforms = entry.transforms()
    pre = {
        "resize": "shorter",
        "size": int(transforms.resize_size[0]) if transforms.resize_size else TORCHVISION_SIZE,
        "mean": tuple(float(v) for v in transforms.mean),
        "std": tuple(float(v) for v in transforms.std),
        "interpolation": str(transforms.interpolation.value),
    }
    return network, list(entry.meta.get("categories", [])), pre


def _huggingface(path: Path, weights: str | None) -> tuple[nn.Module, list[str], dict[str, Any], bool, str | None]:
    import transformers

    if weights:
        raise InvalidSpecError(f"--weights does not apply to a Hugging Face checkpoint ({path} holds its own)")
    try:
        model = transformers.AutoModelForSemanticSegmentation.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - any loading failure: one line
        raise ModelLoadError(f"cannot load {path} as a semantic segmenter: {one_line(exc, 300)}") from None
    if hasattr(model, "set_attn_implementation"):
        try:
            model.set_attn_implementation("eager")  # the TorchScript exporter traces eager attention
        except Exception:  # noqa: BLE001 - models without a choice of attention
            pass
    id2label = model.config.id2label or {}
    labels = [str(id2label.get(i, id2label.get(str(i), f"class_{i}"))) for i in range(len(id2label))]
    pre, flip = _hf_preprocessing(path)
    file = next((f for f in ("model.safetensors", "pytorch_model.bin") if (path / f).is_file()), None)
    return model, labels, pre, flip, sha256_file(path / file) if file else None


def load_segmenter(source: SegmentationSource, opts: SegmentationOptions) -> Segmenter:
    """The network, its labels and preprocessing (its own, then the flags), and its source record."""
    import torchvision
    import transformers

    weights_sha = sha256_file(Path(opts.weights)) if opts.weights else None
    flip = huggingface = False
    if source.kind == "torchvision":
        network, labels, pre = _torchvision(source.value, opts.weights)
        revision = f"torchvision=={torchvision.__version__}"
        if not opts.weights:
            log.warning("export: %s has random weights (no --weights given)", source.value)
    elif source.kind == "huggingface":
        network, labels, pre, flip, weights_sha = _huggingface(Path(source.value), opts.weights)
        revision, huggingface = f"transformers=={transformers.__version__}", True
    else:
        network, revision = call_factory(source.value), ""
        labels = list(getattr(network, "labels", []) or [])
        pre = {
            "resize": "shorter",
            "size": TORCHVISION_SIZE,
            "mean": IMAGENET["mean"],
            "std": IMAGENET["std"],
            "interpolation": "bilinear",
        }
        if opts.weights:
            load_state(network, read_state(opts.weights), opts.weights, source.value)
        else:
            log.warning("export: %s has random weights (no --weights given)", source.value)
    pre = {
        "resize": opts.resize or pre["resize"],
        "size": opts.resize_size or int(pre["size"]),
        "mean": tuple(float(v) for v in (opts.mean or pre["mean"])),
        "std": tuple(float(v) for v in (opts.std or pre["std"])),
        "interpolation": pre["interpolation"],
    }
    if opts.crop_size:
        raise InvalidSpecError("segmentation does not crop (a map covers the whole photo): drop --crop-size")
    record = {"kind": source.kind, "id": source.value, "revision": revision, "weights_sha256": weights_sha}
    if source.kind == "huggingface":
        record["id"] = Path(source.value).name
    logits = Logits(network.float().eval(), huggingface=huggingface, flip=flip).eval()
    return Segmenter(network=logits, labels=labels, preprocessing=pre, record=record)


def classes_of(network: Logits, size: int) -> int:
    with torch.inference_mode():
        classes = int(network(torch.zeros(1, 3, size, size)).shape[1])
    if not 1 < classes <= MAX_CLASSES:
        raise ExportError(f"the model has {classes} classes; a label map holds 2 to {MAX_CLASSES}")
    return classes


def append_map(model: Any) -> None:
    """After the network's logits: resized back to the input image's height and width (linear,
    half-pixel: `F.interpolate(align_corners=False)`), argmax over classes, as uint8 `label_map`."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph

    def const(name: str, value: Any) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), f"post/{name}"))
        return f"post/{name}"

    nodes = [
        helper.make_node("Shape", [IMAGES.name], ["post/image_shape"], name="post/image_shape"),
        helper.make_node(
            "Slice", ["post/image_shape", const("one", [1]), const("three", [3])], ["post/hw"], name="post/hw"
        ),
        helper.make_node("Shape", [LOGITS.name], ["post/logit_shape"], name="post/logit_shape"),
        helper.make_node(
            "Slice", ["post/logit_shape", const("zero", [0]), const("two", [2])], ["post/nc"], name="post/nc"
        ),
        helper.make_node("Concat", ["post/nc", "post/hw"], ["post/sizes"], axis=0, name="post/sizes"),
        helper.make_node(
            "Resize",
            [LOGITS.name, "", "", "post/sizes"],
            ["post/resized"],
            mode="linear",
            coordinate_transformation_mode="half_pixel",
            name="post/resize",
        ),
        helper.make_node("ArgMax", ["post/resized"], ["post/classes"], axis=1, keepdims=0, name="post/argmax"),
        helper.make_node("Cast", ["post/classes"], [OUTPUT], to=TensorProto.UINT8, name="post/cast"),
    ]
    graph.node.extend(nodes)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.UINT8, list(SIGNATURE.outputs[0].shape)))


def export_graph(segmenter: Segmenter, classes: int, out_dir: Path, opset: int) -> None:
    """model.onnx (and preprocess.onnx) in `out_dir`: the preprocessing, the network, the map."""
    pre = segmenter.preprocessing
    layout = {
        "resize_size": pre["size"],
        "crop_size": pre["size"],
        "mean": pre["mean"],
        "std": pre["std"],
        "interpolation": pre["interpolation"],
        "mode": pre["resize"],
    }
    export_graphs(layout, segmenter.network, LOGITS, {"classes": classes}, out_dir, opset, post=append_map)
    if pre["resize"] == "shorter":
        _check_other_sizes(out_dir / "model.onnx", int(pre["size"]))


def _check_other_sizes(path: Path, size: int) -> None:
    """A "shorter" graph takes every aspect: run it on a landscape and a portrait image, and say
    what to do when the network was traced with its size baked in (a ViT's patch grid, "SAME"
    padding)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for height, width in ((size, size * 3 // 2), (size * 4 // 3, size)):
        try:
            out = session.run(None, {IMAGES.name: np.zeros((1, height, width, 3), dtype=np.uint8)})[0]
        except Exception as exc:  # noqa: BLE001 - any runtime failure: one line with the way out
            raise ExportError(
                f"the exported network takes only the size it was traced at ({one_line(exc, 160)}): "
                "give --task-option resize=fixed (both sides to --resize-size)"
            ) from None
        if out.shape[1:] != (height, width):
            raise ExportError(f"the graph's map is {list(out.shape[1:])} for a {height}x{width} image")


class TorchSegmenter:
    """PyTorch's map of one decoded image: torchvision's resize on uint8, the network, the logits
    resized back a few classes at a time, the argmax (first of equals, as ONNX's), and the
    decisive pixels."""

    def __init__(self, segmenter: Segmenter) -> None:
        from torchvision.transforms import v2

        pre = segmenter.preprocessing
        size = pre["size"] if pre["resize"] == "shorter" else [pre["size"], pre["size"]]
        self.resize = v2.Resize(size, interpolation=v2.InterpolationMode(pre["interpolation"]), antialias=True)
        self.mean = torch.tensor(pre["mean"]).view(1, 3, 1, 1)
        self.std = torch.tensor(pre["std"]).view(1, 3, 1, 1)
        self.network = segmenter.network

    @torch.inference_mode()
    def logits(self, images: np.ndarray) -> torch.Tensor:
        """uint8 [N, H, W, 3] (one size) to the network's logits."""
        x = self.resize(torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)).float() / 255.0
        return self.network((x - self.mean) / self.std)

    @torch.inference_mode()
    def maps(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """uint8 maps [N, H, W] and bool decisive masks [N, H, W] of same-size images."""
        logits = self.logits(images)
        height, width = images.shape[1:3]
        shape = (logits.shape[0], height, width)
        best = torch.full(shape, -torch.inf)
        second = torch.full(shape, -torch.inf)
        index = torch.zeros(shape, dtype=torch.int64)
        total = torch.full(shape, -torch.inf)  # log-sum-exp of every class's logit
        for start in range(0, logits.shape[1], CLASS_CHUNK):
            part = F.interpolate(
                logits[:, start : start + CLASS_CHUNK], size=(height, width), mode="bilinear", align_corners=False
            )
            total = torch.logaddexp(total, torch.logsumexp(part, dim=1))
            top = torch.topk(part, min(2, part.shape[1]), dim=1)  # ties: the lower index first
            first = top.values[:, 0]
            runner = top.values[:, 1] if part.shape[1] > 1 else torch.full(shape, -torch.inf)
            # argmax takes the first of equal logits: a later class must be strictly larger
            first_index = part.argmax(dim=1) + start
            wins = first > best
            second = torch.where(wins, torch.maximum(best, runner), torch.maximum(second, first))
            index = torch.where(wins, first_index, index)
            best = torch.where(wins, first, best)
        gap = torch.exp(best - total) - torch.exp(second - total)
        return index.to(torch.uint8).numpy(), (gap >= DECISIVE_MARGIN).numpy()

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        maps, decisive = self.maps(image[None])
        return maps[0], decisive[0]


def pack_maps(maps: list[np.ndarray], decisive: list[np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Per-image maps and decisive masks, flat end to end, with each image's end and shape."""
    return {
        f"{prefix}_ends": np.cumsum([m.size for m in maps]).astype(np.int64),
        f"{prefix}_shapes": np.array([m.shape for m in maps], dtype=np.int64).reshape(-1, 2),
        f"{prefix}_maps": np.concatenate([m.reshape(-1) for m in maps]).astype(np.uint8),
        f"{prefix}_decisive": np.concatenate([d.reshape(-1) for d in decisive]).astype(bool),
    }


def class_shares(maps: list[np.ndarray], classes: int) -> np.ndarray:
    """Per map, the share of its pixels in each class: the reference's `outputs` (what the export
    step's degenerate check reads: maps of one class everywhere prove nothing)."""
    return np.stack([np.bincount(m.reshape(-1), minlength=classes)[:classes] / max(m.size, 1) for m in maps]).astype(
        np.float32
    )


def export_segmenter(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` into `out_dir`; return what was written."""
    import onnx
    import torchvision

    opts = spec.options_as(SegmentationOptions)
    if spec.opset < MIN_OPSET:
        raise InvalidSpecError(f"segmenters export at opset {MIN_OPSET} or later, not {spec.opset}")
    source = parse_segmentation_source(spec.source)
    files = validation_files(opts)
    calibration = read_image_files(opts.calibration_images, "calibration images") if opts.calibration_images else []
    segmenter = load_segmenter(source, opts)
    size = int(segmenter.preprocessing["size"])
    classes = classes_of(segmenter.network, size)
    labels = labels_for(opts.labels, segmenter.labels, classes)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    log.info("export: %s to ONNX (opset %d), the map at the image's size in the graph", spec.source, spec.opset)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_graph(segmenter, classes, out_dir, spec.opset)
    except (ModelLoadError, InvalidSpecError):
        raise
    except Exception as exc:  # noqa: BLE001 - any exporter failure: one line
        raise ExportError(f"cannot export {spec.source} to ONNX: {one_line(exc, 300)}") from None
    seconds = time.perf_counter() - t0
    reference = TorchSegmenter(segmenter)
    decoded = [reference_decode(data) for _, data in files]
    log.info("export: PyTorch reference maps on %d files", len(files))
    served = [reference(image) for image in decoded]
    group = batch_group(decoded)
    grouped = reference.maps(np.stack(group)) if group else None
    if calibration:
        calibration_offsets, calibration_data = pack_files([d for _, d in calibration])
        np.savez(out_dir / CALIBRATION_FILE, offsets=calibration_offsets, data=calibration_data)
    offsets, data = pack_files([data for _, data in files])
    maps = [m for m, _ in served]
    arrays: dict[str, np.ndarray] = {
        "task": np.array("semantic-segmentation"),
        "input_names": np.array([IMAGES.name]),
        "served_names": np.array([name for name, _ in files]),
        "served_formats": np.array([format_of(data) for _, data in files]),
        "served_offsets": offsets,
        "served_data": data,
        "outputs": class_shares(maps, classes),
        "batch_images": np.stack(group) if group else np.zeros((0, 1, 1, 3), dtype=np.uint8),
        **pack_maps(maps, [d for _, d in served], "served"),
    }
    if grouped is not None:
        arrays.update(pack_maps(list(grouped[0]), list(grouped[1]), "batch"))
    Reference.write(out_dir / REFERENCE_FILE, arrays)
    present = int((arrays["outputs"].max(axis=0) > 0).sum())
    log.info("export: reference maps on %d files hold %d of %d classes", len(files), present, classes)
    graph = onnx.load(str(out_dir / "model.onnx"), load_external_data=False)
    pre = segmenter.preprocessing
    return ExportResult(  # written once, by ortpack.components.core.export.export_model
        task="semantic-segmentation",
        name=spec.name,
        source=segmenter.record,
        inputs=[t.spec() for t in SIGNATURE.inputs],
        outputs=[t.spec() for t in SIGNATURE.outputs],
        opset=spec.opset,
        model_info={"model_type": source.default_name, "classes": classes, "size": size},
        metrics={
            "nodes": float(len(graph.graph.node)),
            "mb": (out_dir / "model.onnx").stat().st_size / 1e6,
            "seconds": seconds,
            "validation_files": float(len(files)),
            "reference_classes_present": float(present),
        },
        torch_latency=_torch_latency(reference),
        versions={"torch": torch.__version__, "torchvision": torchvision.__version__, "onnx": onnx.__version__},
        task_settings={
            "preprocessing": {
                "input_dtype": "uint8",
                "layout": "NHWC",
                "color": "RGB",
                "resize": pre["resize"],
                "size": size,
                "interpolation": pre["interpolation"],
                "antialias": True,
                "mean": list(pre["mean"]),
                "std": list(pre["std"]),
                "decode": "exact",
            },
            "labels": labels,
        },
        extra_files=[],
    )


def _torch_latency(reference: TorchSegmenter) -> dict[str, dict[str, float]]:
    """PyTorch's latency at `BENCH_SHAPES`: the whole path as a user would write it (torchvision's
    resize, the network, `F.interpolate` back to the image, the argmax)."""
    log.info("export: measuring PyTorch eager latency (resize, network, map)")

    @torch.inference_mode()
    def segment(images: np.ndarray) -> torch.Tensor:
        logits = reference.logits(images)
        return F.interpolate(logits, size=images.shape[1:3], mode="bilinear", align_corners=False).argmax(dim=1)

    latency = {}
    for key, (n, h, w) in BENCH_SHAPES.items():
        images = np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)])
        latency[key] = measure_latency(partial(segment, images), budget_s=3.0)
    return latency
