"""What the exporters of image tasks share: preprocessing in the graph and the reference it must
match, the validation set and the served path's decode.

- `ImagePreprocess`: raw uint8 `images` `[batch, height, width, 3]` (RGB, any size) to normalised
  `pixels` `[batch, 3, crop, crop]`: resize of the shorter side (antialiased, bilinear or bicubic
  as the weights' transforms say, in fixed point as torchvision's uint8 kernel), centre crop,
  scale to [0, 1], normalise. Built node by node (`preprocess.onnx`), then composed with the
  network and its head (`export_graphs`: the network by the TorchScript exporter, node names
  prefixed `net/`, the preprocessing `pre/`), so later steps can keep preprocessing in fp32 when
  they quantize the network.
- `reference_transform` / `reference_decode`: torchvision's own transforms and Pillow's full
  decode, what the graph and the server's decoder are compared with.
- The validation set: the user's photos (`photo_validation_set`) or generated images
  (`generated_validation_set`), as raw pixels and as encoded files.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.errors import ExportError, InvalidSpecError, ModelLoadError
from ortpack.components.core.exporters.image_models import default_preprocessing, parse_image_source
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.timing import measure_latency
from ortpack.components.core.validation_data import (
    ImageSpec,
    encode_png,
    encode_validation_image,
    encoded_validation_images,
    pack_files,
    read_image_files,
    render_image,
    validation_images,
)
from ortpack.kernel.contracts.images import IMAGES, ImageModelOptions
from ortpack.kernel.contracts.tensors import BATCH, Tensor

log = logging.getLogger("ortpack.export")

INPUT_NAME = IMAGES.name  # the graph's input, as the task contracts declare it
PIXELS_NAME = "pixels"  # between the preprocessing and the network, inside the graph

MIN_OPSET = 13  # ReduceSum and Unsqueeze take their axes as inputs from opset 13


BENCH_SHAPES = {"b1_480x640": (1, 480, 640), "b8_480x640": (8, 480, 640)}


# filter support (in input pixels at scale 1) and the cubic coefficient: torchvision's and Pillow's
_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}


_CUBIC_A = -0.5


# Bilinear weights in fixed point: with 15 bits a weight of 1 has a high byte of 128, which fits
# uint8 around the zero point 127 (torchvision's kernel uses 16-17 bits, Pillow's 22).
_WEIGHT_BITS = 15


@dataclass(frozen=True, kw_only=True)
class ImagePreprocess:
    """uint8 `[N, H, W, 3]` to the network's normalised float `[N, 3, crop, crop]`, as an ONNX graph.

    The same steps as torchvision's `Resize(resize_size, antialias=True)`, `CenterCrop(crop_size)`
    and `Normalize(mean, std)` on uint8 tensors (Pillow's algorithm): the shorter side becomes
    `resize_size` (the longer `floor(long * resize / short)`), the crop offset is Python's
    round-half-to-even of half the excess, and the resize is two one-dimensional passes,
    horizontal then vertical, each rounded and saturated to uint8 levels, with the antialiasing
    filter's taps and weights computed in the graph from the image's size (no branch on it: one
    graph takes every size).

    Written as explicit ONNX operators, not exported from torch, because it computes only what
    the crop keeps: the horizontal pass runs on the rows the vertical pass reads and produces only
    the crop's columns, each pass a gather of the taps (uint8) and one batched matrix product of
    the weights with them (`_weigh`). Measured on one core for a 1280x960 photo: ONNX Runtime's
    antialiased Resize (the dynamo export of torch's interpolate) 13.5 ms, this 5.0 ms (loaded
    machine; 2.7 against 4.2 ms at 640x480). Pixels agree with torchvision's uint8 kernel within
    one level, downscaling and upscaling (bicubic upscales of tiny images: two).
    """

    resize_size: int
    crop_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    # "crop": the shorter side to resize_size, then the centre crop (classifiers, embedders);
    # "shorter": the shorter side to resize_size, the whole image kept (`[N, 3, h, w]`, h and w
    # vary); "fixed": both sides to resize_size, the aspect not kept (segmentation: a mask covers
    # the whole photo)
    mode: str = "crop"

    def graph(self, opset: int) -> Any:
        """The preprocessing as an ONNX model: `images` uint8 NHWC in, `pixels` float NCHW out."""
        import onnx
        from onnx import TensorProto, helper

        g = GraphBuilder()
        shape = g.op("Shape", INPUT_NAME)
        n, h, w = (g.op("Slice", shape, g.const([i]), g.const([i + 1])) for i in range(3))
        if self.mode == "fixed":
            new_h = new_w = crop_h = crop_w = g.const([self.resize_size])
        else:
            short = g.op("Min", h, w)
            new_h = g.op("Div", g.op("Mul", h, g.const([self.resize_size])), short)
            new_w = g.op("Div", g.op("Mul", w, g.const([self.resize_size])), short)
            crop_h, crop_w = (new_h, new_w) if self.mode == "shorter" else (g.const([self.crop_size]),) * 2
        if self.mode == "crop":
            top, left = self._offset(g, new_h, crop_h), self._offset(g, new_w, crop_w)
        else:
            top = left = g.const([0])
        rows, row_weights = self._taps(g, h, new_h, top, crop_h)
        cols, col_weights = self._taps(g, w, new_w, left, crop_w)
        three = g.const([3])
        # horizontal pass, on the input rows the vertical pass reads: [rows, W*3] -> [W, 3*N*rows]
        first = g.op("Reshape", g.op("ReduceMin", rows, keepdims=0), g.const([1]))
        last = g.op("Add", g.op("Reshape", g.op("ReduceMax", rows, keepdims=0), g.const([1])), g.const([1]))
        span = g.op("Sub", last, first)
        band = g.op("Slice", INPUT_NAME, first, last, g.const([1]))  # [N, span, W, 3]
        band = g.op("Reshape", band, g.op("Concat", g.op("Mul", n, span), g.const([-1]), axis=0))
        band = g.op("Transpose", band, perm=[1, 0])  # [W*3, N*span]: a plain 2-D transpose is fast
        band = g.op("Reshape", band, g.op("Concat", w, g.const([-1]), axis=0))  # [W, 3*N*span]
        x = self._weigh(g, g.op("Gather", band, cols, axis=0), col_weights)  # [crop_w, 1, 3*N*span]
        # vertical pass: [crop_w*3*N, span] -> [span, crop_w*3*N], gather the taps, weigh them
        x = g.op("Reshape", x, g.op("Concat", g.op("Mul", crop_w, g.op("Mul", three, n)), span, axis=0))
        x = g.op("Transpose", x, perm=[1, 0])
        x = self._weigh(g, g.op("Gather", x, g.op("Sub", rows, first), axis=0), row_weights)  # [crop_h, 1, crop_w*3*N]
        # [crop_h * crop_w, 3 * N] -> [3, N, crop_h, crop_w] (a 2-D transpose) -> [N, 3, crop_h, crop_w]
        x = g.op(
            "Transpose",
            g.op("Reshape", x, g.op("Concat", g.op("Mul", crop_h, crop_w), g.op("Mul", three, n), axis=0)),
            perm=[1, 0],
        )
        x = g.op("Transpose", g.op("Reshape", x, g.op("Concat", three, n, crop_h, crop_w, axis=0)), perm=[1, 0, 2, 3])
        x = g.op("Cast", x, to=TensorProto.FLOAT)
        mean = np.array(self.mean, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
        std = np.array(self.std, dtype=np.float32).reshape(1, 3, 1, 1) * 255.0
        g.op("Div", g.op("Sub", x, g.const(mean, np.float32)), g.const(std, np.float32), output=PIXELS_NAME)
        graph = helper.make_graph(
            g.nodes,
            "preprocess",
            [helper.make_tensor_value_info(INPUT_NAME, TensorProto.UINT8, list(IMAGES.shape))],
            [helper.make_tensor_value_info(PIXELS_NAME, TensorProto.FLOAT, ["batch", 3, *self.output_size])],
            g.initializers,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortpack")
        onnx.checker.check_model(model, full_check=True)
        return model

    @property
    def output_size(self) -> tuple[int | str, int | str]:
        """The pixels' height and width: the crop, the fixed size, or named (they vary)."""
        if self.mode == "shorter":
            return ("resized_height", "resized_width")
        side = self.resize_size if self.mode == "fixed" else self.crop_size
        return (side, side)

    @staticmethod
    def _offset(g: GraphBuilder, size: str, crop: str) -> str:
        """round((size - crop) / 2), half to even, like CenterCrop (crop <= size here)."""
        excess = g.op("Sub", size, crop)
        half = g.op("Div", excess, g.const([2]))
        odd_half_odd = g.op("Mul", g.op("Mod", half, g.const([2])), g.op("Mod", excess, g.const([2])))
        return g.op("Div", g.op("Add", excess, odd_half_odd), g.const([2]))

    def _taps(self, g: GraphBuilder, size_in: str, size_out: str, start: str, count: str) -> tuple[str, str]:
        """For output positions `start .. start+count` of a resize from `size_in` to `size_out`
        along one axis: the input index of each tap `[count, K]` (int64), its weight `[count, K]`
        (float64, each row sums to 1), K = 2 * ceil(support) + 1 taps. torchvision's `_compute_index_ranges_weights`:
        center = scale * (i + 0.5), taps from int(center - support + 0.5) to
        int(center + support + 0.5) (clipped to the image), weight filter((j - center + 0.5) / s)
        with s = max(scale, 1), normalised."""
        from onnx import TensorProto

        f64 = np.float64
        size_in_f = g.op("Cast", size_in, to=TensorProto.DOUBLE)
        scale = g.op("Div", size_in_f, g.op("Cast", size_out, to=TensorProto.DOUBLE))
        stretch = g.op("Max", scale, g.const(1.0, f64))
        support = g.op("Mul", stretch, g.const(_SUPPORT[self.interpolation], f64))
        k = g.op("Add", g.op("Mul", g.op("Cast", g.op("Ceil", support), to=TensorProto.INT64), g.const(2)), g.const(1))
        k = g.op("Reshape", k, g.const([1]))
        out = g.op(
            "Cast",
            g.op("Range", g.op("Squeeze", start), g.op("Squeeze", g.op("Add", start, count)), g.const(1)),
            to=TensorProto.DOUBLE,
        )
        center = g.op("Unsqueeze", g.op("Mul", g.op("Add", out, g.const(0.5, f64)), scale), g.const([1]))  # [count, 1]
        lo = g.op("Max", g.op("Floor", g.op("Add", g.op("Sub", center, support), g.const(0.5, f64))), g.const(0.0, f64))
        hi = g.op("Min", g.op("Floor", g.op("Add", g.op("Add", center, support), g.const(0.5, f64))), size_in_f)
        position = g.op(
            "Add", lo, g.op("Cast", g.op("Range", g.const(0), g.op("Squeeze", k), g.const(1)), to=TensorProto.DOUBLE)
        )
        x = g.op("Abs", g.op("Div", g.op("Add", g.op("Sub", position, center), g.const(0.5, f64)), stretch))
        if self.interpolation == "bilinear":
            weight = g.op("Max", g.op("Sub", g.const(1.0, f64), x), g.const(0.0, f64))
        else:  # Keys' cubic with a = -0.5, zero beyond 2
            a = _CUBIC_A
            x2 = g.op("Mul", x, x)
            x3 = g.op("Mul", x2, x)
            near = g.op(
                "Add",
                g.op("Sub", g.op("Mul", x3, g.const(a + 2, f64)), g.op("Mul", x2, g.const(a + 3, f64))),
                g.const(1.0, f64),
            )
            far = g.op("Mul", x3, g.const(a, f64))
            far = g.op(
                "Add", g.op("Sub", far, g.op("Mul", x2, g.const(5 * a, f64))), g.op("Mul", x, g.const(8 * a, f64))
            )
            far = g.op("Sub", far, g.const(4 * a, f64))
            weight = g.op(
                "Where",
                g.op("Less", x, g.const(1.0, f64)),
                near,
                g.op("Where", g.op("Less", x, g.const(2.0, f64)), far, g.const(0.0, f64)),
            )
        weight = g.op("Where", g.op("Less", position, hi), weight, g.const(0.0, f64))  # taps past the image: none
        weight = g.op("Div", weight, g.op("ReduceSum", weight, g.const([1]), keepdims=1))
        index = g.op("Cast", g.op("Min", position, g.op("Sub", size_in_f, g.const(1.0, f64))), to=TensorProto.INT64)
        return index, weight

    def _weigh(self, g: GraphBuilder, taps: str, weights: str) -> str:
        """Each output position's taps `[count, K, R]` (uint8) weighed by its weights `[count, K]`
        (float64), rounded half up and saturated to uint8 levels: `[count, 1, R]` uint8.

        Bilinear weights (in [0, 1]) are applied in integers, to the uint8 taps, like
        torchvision's kernel: 15-bit fixed point, each weight split into a high and a low byte
        (balanced, so both fit uint8 around the zero point 127), and one MatMulInteger gives both
        partial sums. Reading uint8 taps instead of casting them to float first (they are ~1.6
        times the image) halves the graph's time on large photos. Bicubic weights overshoot 1 and
        go negative near the borders, so bicubic stays in float32 (the taps cast first).
        QuantizeLinear saturates to [0, 255] and casts in one operator."""
        from onnx import TensorProto

        f64 = np.float64
        if self.interpolation != "bilinear":
            weights = g.op("Cast", g.op("Unsqueeze", weights, g.const([1])), to=TensorProto.FLOAT)
            x = g.op("MatMul", weights, g.op("Cast", taps, to=TensorProto.FLOAT))
            x = g.op("Floor", g.op("Add", x, g.const(np.float32(0.5), np.float32)))  # round half up
            unit = 1.0
        else:
            fixed = g.op("Round", g.op("Mul", weights, g.const(float(1 << _WEIGHT_BITS), f64)))
            high = g.op("Floor", g.op("Div", g.op("Add", fixed, g.const(127.0, f64)), g.const(256.0, f64)))  # <= 128
            low = g.op("Sub", fixed, g.op("Mul", high, g.const(256.0, f64)))  # in [-127, 128]
            parts = g.op("Concat", g.op("Unsqueeze", high, g.const([1])), g.op("Unsqueeze", low, g.const([1])), axis=1)
            parts = g.op("Cast", g.op("Add", parts, g.const(127.0, f64)), to=TensorProto.UINT8)  # [count, 2, K]
            sums = g.op("MatMulInteger", parts, taps, g.const(np.uint8(127), np.uint8))  # [count, 2, R] int32
            # high * 256 + low: exact in float32 (at most 255 * 2^15 < 2^24)
            combine = g.const(np.array([[256.0, 1.0]], dtype=np.float32), np.float32)
            x = g.op("MatMul", combine, g.op("Cast", sums, to=TensorProto.FLOAT))  # [count, 1, R]
            # + 0.5 makes QuantizeLinear's half-to-even round exact ties up, as torchvision does
            # (bilinear upscales hit ties often); still exact in float32, below 2^23
            x = g.op("Add", x, g.const(np.float32(0.5), np.float32))
            unit = float(1 << _WEIGHT_BITS)
        return g.op("QuantizeLinear", x, g.const(np.float32(unit), np.float32), g.const(np.uint8(0), np.uint8))


class GraphBuilder:
    """Nodes and constants of a small ONNX graph, named in order (`pre/...` once composed)."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        self._count += 1
        name = f"c{self._count}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attributes: Any) -> str:
        from onnx import helper

        self._count += 1
        name = output or f"t{self._count}"
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [name], name=f"{op_type}_{self._count}", **attributes)
        )
        return name


def preprocessing_spec(spec: ExportSpec) -> dict[str, Any]:
    """Resize, crop, mean, std and interpolation: the model's defaults (image_models.py), then flags."""
    opts = spec.options_as(ImageModelOptions)
    source = parse_image_source(spec.source, local=False)
    defaults = default_preprocessing(source, opts.weights, opts.resize_size, opts.crop_size)
    interpolation = str(defaults["interpolation"])
    if interpolation not in ("bilinear", "bicubic"):
        raise ExportError(f"{spec.source} uses {interpolation} resizing; ortpack exports bilinear and bicubic")
    resize, crop = opts.resize_size or int(defaults["resize_size"]), opts.crop_size or int(defaults["crop_size"])
    if crop > resize:
        raise InvalidSpecError(f"crop size {crop} is larger than the resize size {resize}")
    return {
        "resize_size": resize,
        "crop_size": crop,
        "mean": tuple(float(v) for v in (opts.mean or defaults["mean"])),
        "std": tuple(float(v) for v in (opts.std or defaults["std"])),
        "interpolation": interpolation,
    }


def reference_transform(pre: dict[str, Any]) -> Any:
    """torchvision's own pipeline on uint8 tensors: what the graph must reproduce."""
    from torchvision.transforms import v2

    mode = v2.InterpolationMode(pre["interpolation"])
    return v2.Compose(
        [v2.Resize(pre["resize_size"], interpolation=mode, antialias=True), v2.CenterCrop(pre["crop_size"])]
    )


def torch_latency(model: nn.Module, pre: dict[str, Any]) -> dict[str, dict[str, float]]:
    """PyTorch's latency at `BENCH_SHAPES`: torchvision's transforms, then `model` on the
    normalised pixels."""
    log.info("export: measuring PyTorch eager latency (torchvision transforms + model)")
    transform = reference_transform(pre)
    mean, std = torch.tensor(pre["mean"]).view(1, 3, 1, 1), torch.tensor(pre["std"]).view(1, 3, 1, 1)

    def torch_call(batch: torch.Tensor) -> torch.Tensor:
        x = transform(batch.permute(0, 3, 1, 2)).float() / 255.0
        return model((x - mean) / std)

    latency = {}
    with torch.inference_mode():
        for key, (n, h, w) in BENCH_SHAPES.items():
            batch = torch.from_numpy(np.stack([render_image(ImageSpec(h, w, "smooth", i)) for i in range(n)]))
            latency[key] = measure_latency(partial(torch_call, batch), budget_s=3.0)
    return latency


def export_graphs(
    pre: dict[str, Any],
    head: nn.Module,
    output: Tensor,
    sizes: Mapping[str, int],
    out_dir: Path,
    opset: int,
    post: Callable[[Any], None] | None = None,
) -> None:
    """preprocess.onnx (`ImagePreprocess`, its `mode` from `pre`, default "crop"), the network
    with its head (`head`: normalised pixels `[batch, 3, h, w]` to `output`, TorchScript exporter,
    its dimensions that `sizes` does not fix dynamic; h and w too when the preprocessing keeps the
    aspect), and model.onnx, the two composed, then `post` (which may add nodes after the
    network's output), all at `opset`."""
    import onnx
    from onnx import compose

    layout = ImagePreprocess(
        resize_size=pre["resize_size"],
        crop_size=pre["crop_size"],
        mean=pre["mean"],
        std=pre["std"],
        interpolation=pre["interpolation"],
        mode=pre.get("mode", "crop"),
    )
    preprocess = layout.graph(opset)
    onnx.save(preprocess, str(out_dir / "preprocess.onnx"))
    height, width = layout.output_size
    side = pre["resize_size"] if isinstance(height, str) else height
    pixel_axes: dict[int, str] = {0: BATCH}
    if isinstance(height, str):
        pixel_axes.update({2: str(height), 3: str(width)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            head,
            (torch.randn(2, 3, side, side),),
            str(out_dir / "network.onnx"),
            dynamo=False,
            opset_version=opset,
            input_names=[PIXELS_NAME],
            output_names=[output.name],
            dynamic_axes={PIXELS_NAME: pixel_axes, output.name: output.dynamic_axes(sizes)},
        )
    net = onnx.load(str(out_dir / "network.onnx"))
    preprocess.ir_version = net.ir_version = min(preprocess.ir_version, net.ir_version)
    keep = {"rename_inputs": False, "rename_outputs": False}
    model = compose.merge_models(
        compose.add_prefix(preprocess, "pre/", **keep),
        compose.add_prefix(net, "net/", **keep),
        io_map=[(PIXELS_NAME, PIXELS_NAME)],
    )
    opsets: dict[str, int] = {}  # merge_models lists each graph's opset imports: one per domain is the valid form
    for imp in model.opset_import:
        opsets[imp.domain] = max(opsets.get(imp.domain, 0), imp.version)
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())
    if post is not None:
        post(model)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(out_dir / "model.onnx"))
    (out_dir / "network.onnx").unlink()


def photo_pixel_set(photos: list[np.ndarray], crop: int) -> list[np.ndarray]:
    """The raw-pixel set from decoded photos: two groups of 8 same-size centre crops first (the
    batch-8 checks: 1.25 x and 1.75 x the crop size, from the photos large enough), then every
    photo as it is (batch 1)."""
    images: list[np.ndarray] = []
    for side in (int(crop * 1.25), int(crop * 1.75)):
        large = [p for p in photos if min(p.shape[:2]) >= side][:8]
        if len(large) == 8:
            for p in large:
                top, left = (p.shape[0] - side) // 2, (p.shape[1] - side) // 2
                images.append(np.ascontiguousarray(p[top : top + side, left : left + side]))
    return images + photos


def reference_decode(data: bytes) -> np.ndarray:
    """The reference decode of a file: Pillow, every pixel, EXIF orientation applied, RGB. Written
    apart from the server's decoder (kernel/images.py), which the gate checks against it."""
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as image:
        return np.array(ImageOps.exif_transpose(image).convert("RGB"))


def reference_decode_size(data: bytes) -> int:
    """Pixels in the file (from its header)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return int(image.size[0] * image.size[1])


@dataclass(frozen=True)
class ValidationSet:
    """What the reference runs on: raw-pixel images (the graph's preprocessing against
    torchvision's) and encoded files (the server's decode), each file's name, format and
    (width, height), and `raw`: how the raw images travel in reference.npz."""

    images: list[np.ndarray]
    files: list[bytes]
    names: list[str]
    formats: list[str]
    sizes: list[tuple[int, int]]
    raw: dict[str, Any]


def generated_validation_set() -> ValidationSet:
    """The generated images and files; the images travel as their specs (rendered again where
    they are needed)."""
    specs = validation_images()
    encoded = encoded_validation_images()
    validation = ValidationSet(
        images=[render_image(s) for s in specs],
        files=[encode_validation_image(s) for s in encoded],
        names=[s.name for s in encoded],
        formats=[s.format for s in encoded],
        sizes=[(s.width, s.height) for s in encoded],
        raw={
            "heights": np.array([s.height for s in specs]),
            "widths": np.array([s.width for s in specs]),
            "kinds": np.array([s.kind for s in specs]),
            "seeds": np.array([s.seed for s in specs]),
        },
    )
    log.info(
        "export: PyTorch reference outputs on %d generated images and %d files",
        len(validation.images),
        len(validation.files),
    )
    return validation


def photo_validation_set(photos: list[tuple[str, bytes]], crop: int, where: str) -> ValidationSet:
    """The user's photos (read from `where`) as files, and `photo_pixel_set` of their reference
    decodes as images, which travel as lossless PNGs."""
    files = [data for _, data in photos]
    decoded = [reference_decode(f) for f in files]
    images = photo_pixel_set(decoded, crop)
    raw_offsets, raw_data = pack_files([encode_png(im) for im in images])
    log.info("export: PyTorch reference outputs on %d photos (%s)", len(files), where)
    return ValidationSet(
        images=images,
        files=files,
        names=[name for name, _ in photos],
        formats=[format_of(f) for f in files],
        sizes=[(d.shape[1], d.shape[0]) for d in decoded],
        raw={"raw_offsets": raw_offsets, "raw_data": raw_data},
    )


def preprocessing_settings(pre: dict[str, Any], decode: dict[str, Any]) -> dict[str, Any]:
    """The manifest's preprocessing section: what the graph takes and does, and the decode."""
    return {
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
        **decode,
    }


def format_of(data: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return str(image.format)


def batch_group(images: list[np.ndarray], count: int = 4) -> list[np.ndarray]:
    """`count` same-size crops of the largest image (a batch check on decoded files), or none when
    it is too small."""
    largest = max(images, key=lambda im: im.shape[0] * im.shape[1])
    side = min(largest.shape[:2]) * 3 // 4
    if side < 32:
        return []
    steps = [
        (i * (largest.shape[0] - side) // (count - 1), i * (largest.shape[1] - side) // (count - 1))
        for i in range(count)
    ]
    return [np.ascontiguousarray(largest[y : y + side, x : x + side]) for y, x in steps]


def validation_files(opts: ImageModelOptions) -> list[tuple[str, bytes]]:
    """The files a detector's or segmenter's gate runs: the user's photos, else the generated
    encoded images (which a trained model rarely finds anything in: give photos of its domain)."""
    if opts.validation_images:
        return read_image_files(opts.validation_images, "validation images")
    return [(s.name, encode_validation_image(s)) for s in encoded_validation_images()]


def read_labels_file(path: str, classes: int, model: str = "the model") -> list[str]:
    """The labels file at `path`: one per line, as many as `model`'s classes."""
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"labels file not found: {path}")
    lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if len(lines) != classes:
        raise ModelLoadError(f"{path} has {len(lines)} labels; {model} has {classes} classes")
    return lines


def labels_for(path: str | None, known: list[str], classes: int) -> list[str]:
    """The labels file at `path` (`read_labels_file`), else the model's own labels when it has one
    per class, else `class_N`."""
    if path is not None:
        return read_labels_file(path, classes)
    if len(known) == classes:
        return known
    return [f"class_{i}" for i in range(classes)]
