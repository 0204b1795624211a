"""The graphs around a detector whose network returns raw head outputs (`decoder` "yolo"), and the
same steps in PyTorch (the reference the graph is gated against).

`[batch, 4 + classes, anchors]`: box centre x, y, width and height in the network's input pixels,
then per-class scores (Ultralytics' YOLOv8 head, as it exports). Around it:

- `letterbox_graph` (nodes `pre/`): raw uint8 `images` `[batch, height, width, 3]` (RGB, any size;
  a batch's images share one) scaled to fit `size` x `size` keeping their aspect (bilinear, no
  antialiasing, at half-pixel centres: torch's `interpolate`), padded with `pad_value` to the
  square (the image in the middle, the odd pixel at the bottom and right), scaled to [0, 1];
- `decode_graph` (nodes `post/`): class-wise non-maximum suppression (ONNX `NonMaxSuppression`
  on the centre-form boxes, scores above the threshold, at most `max_detections` per class and
  image), then the boxes as corners, back in the image's own pixels (the letterbox undone,
  clipped to the image), with their scores, labels and `batch_index`.

`YoloReference` is the same in PyTorch (torch's bilinear resize, torchvision's `batched_nms`), one
image at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ortpack.components.core.exporters.image_common import GraphBuilder
from ortpack.kernel.contracts.images import IMAGES
from ortpack.kernel.contracts.object_detection import BATCH_INDEX, BOXES, LABELS, SCORES

INPUT_NAME = IMAGES.name  # the graph's input, as the contract declares it
PIXELS_NAME, RAW_NAME = "pixels", "raw"  # inside the graph: the letterboxed pixels, the network's raw output


def letterbox_geometry(height: int, width: int, size: int) -> tuple[float, int, int, int, int]:
    """(scale, new height, new width, top pad, left pad) of an image letterboxed into `size`."""
    scale = min(size / height, size / width)
    new_h, new_w = round(height * scale), round(width * scale)
    return scale, new_h, new_w, (size - new_h) // 2, (size - new_w) // 2


def letterbox_graph(size: int, pad_value: int, opset: int) -> Any:
    """`images` uint8 NHWC -> `pixels` float NCHW `[batch, 3, size, size]` in [0, 1]; also the
    `geometry` it used: [scale, top, left, height, width] (float), for `decode_graph`."""
    import onnx
    from onnx import TensorProto, helper

    g = GraphBuilder()
    shape = g.op("Shape", INPUT_NAME)
    n, h, w = (g.op("Slice", shape, g.const([i]), g.const([i + 1])) for i in range(3))
    hf, wf = g.op("Cast", h, to=TensorProto.FLOAT), g.op("Cast", w, to=TensorProto.FLOAT)
    target = g.const([float(size)], np.float32)
    scale = g.op("Min", g.op("Div", target, hf), g.op("Div", target, wf))
    new_h = g.op("Cast", g.op("Round", g.op("Mul", hf, scale)), to=TensorProto.INT64)
    new_w = g.op("Cast", g.op("Round", g.op("Mul", wf, scale)), to=TensorProto.INT64)
    x = g.op("Cast", g.op("Transpose", INPUT_NAME, perm=[0, 3, 1, 2]), to=TensorProto.FLOAT)
    sizes = g.op("Concat", n, g.const([3]), new_h, new_w, axis=0)
    x = g.op(
        "Resize",
        x,
        "",
        "",
        sizes,
        mode="linear",
        coordinate_transformation_mode="pytorch_half_pixel",
    )
    two = g.const([2])
    full = g.const([size])
    top = g.op("Div", g.op("Sub", full, new_h), two)  # integer division: the odd pixel at the bottom
    left = g.op("Div", g.op("Sub", full, new_w), two)
    bottom = g.op("Sub", g.op("Sub", full, new_h), top)
    right = g.op("Sub", g.op("Sub", full, new_w), left)
    zero = g.const([0])
    pads = g.op("Concat", zero, zero, top, left, zero, zero, bottom, right, axis=0)
    x = g.op("Pad", x, pads, g.const(float(pad_value), np.float32), mode="constant")
    g.op("Div", x, g.const(255.0, np.float32), output=PIXELS_NAME)
    geometry = [scale, g.op("Cast", top, to=TensorProto.FLOAT), g.op("Cast", left, to=TensorProto.FLOAT), hf, wf]
    g.op("Concat", *geometry, axis=0, output="geometry")
    graph = helper.make_graph(
        g.nodes,
        "letterbox",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.UINT8, list(IMAGES.shape))],
        [
            helper.make_tensor_value_info(PIXELS_NAME, TensorProto.FLOAT, ["batch", 3, size, size]),
            helper.make_tensor_value_info("geometry", TensorProto.FLOAT, [5]),
        ],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortpack")
    onnx.checker.check_model(model, full_check=True)
    return model


def decode_graph(classes: int, score: float, iou: float, max_detections: int, opset: int) -> Any:
    """`raw` `[batch, 4 + classes, anchors]` and `geometry` -> the detections (flat, with their
    `batch_index`), boxes as corners in the image's pixels."""
    import onnx
    from onnx import TensorProto, helper

    g = GraphBuilder()
    centre = g.op("Transpose", g.op("Slice", RAW_NAME, g.const([0]), g.const([4]), g.const([1])), perm=[0, 2, 1])
    scores = g.op("Slice", RAW_NAME, g.const([4]), g.const([4 + classes]), g.const([1]))  # [B, C, A]
    selected = g.op(
        "NonMaxSuppression",
        centre,
        scores,
        g.const([max_detections]),
        g.const([iou], np.float32),
        g.const([score], np.float32),
        center_point_box=1,
    )  # [K, 3]: image, class, anchor
    image = g.op("Slice", selected, g.const([0]), g.const([1]), g.const([1]))
    label = g.op("Slice", selected, g.const([1]), g.const([2]), g.const([1]))
    anchor = g.op("Slice", selected, g.const([2]), g.const([3]), g.const([1]))
    g.op("Squeeze", image, g.const([1]), output=BATCH_INDEX)
    g.op("Squeeze", label, g.const([1]), output=LABELS)
    g.op("GatherND", scores, selected, output=SCORES)
    box = g.op("GatherND", centre, g.op("Concat", image, anchor, axis=1))  # [K, 4] cx, cy, w, h
    cxcy = g.op("Slice", box, g.const([0]), g.const([2]), g.const([1]))
    half = g.op("Div", g.op("Slice", box, g.const([2]), g.const([4]), g.const([1])), g.const(2.0, np.float32))
    corners = g.op("Concat", g.op("Sub", cxcy, half), g.op("Add", cxcy, half), axis=1)  # x0, y0, x1, y1
    geometry = "geometry"

    def part(i: int) -> str:
        return g.op("Slice", geometry, g.const([i]), g.const([i + 1]))

    scale, top, left, height, width = (part(i) for i in range(5))
    offset = g.op("Concat", left, top, left, top, axis=0)
    limit = g.op("Concat", width, height, width, height, axis=0)
    unboxed = g.op("Div", g.op("Sub", corners, offset), scale)
    g.op("Min", g.op("Max", unboxed, g.const(0.0, np.float32)), limit, output=BOXES)
    graph = helper.make_graph(
        g.nodes,
        "decode",
        [
            helper.make_tensor_value_info(RAW_NAME, TensorProto.FLOAT, ["batch", 4 + classes, "anchors"]),
            helper.make_tensor_value_info(geometry, TensorProto.FLOAT, [5]),
        ],
        [
            helper.make_tensor_value_info(BOXES, TensorProto.FLOAT, ["detections", 4]),
            helper.make_tensor_value_info(SCORES, TensorProto.FLOAT, ["detections"]),
            helper.make_tensor_value_info(LABELS, TensorProto.INT64, ["detections"]),
            helper.make_tensor_value_info(BATCH_INDEX, TensorProto.INT64, ["detections"]),
        ],
        g.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="ortpack")
    onnx.checker.check_model(model, full_check=True)
    return model


def compose(pre: Any, net: Any, post: Any) -> Any:
    """letterbox -> network -> decode, as one model (node names prefixed pre/, net/, post/)."""
    import onnx
    from onnx import compose as onnx_compose

    keep = {"rename_inputs": False, "rename_outputs": False}
    version = min(pre.ir_version, net.ir_version, post.ir_version)
    for part in (pre, net, post):
        part.ir_version = version
    pre = onnx_compose.add_prefix(pre, "pre/", **keep)
    net = onnx_compose.add_prefix(net, "net/", **keep)
    post = onnx_compose.add_prefix(post, "post/", **keep)
    # the letterbox's geometry passes through the network's graph to the decoder
    first = onnx_compose.merge_models(pre, net, io_map=[(PIXELS_NAME, PIXELS_NAME)], outputs=[RAW_NAME, "geometry"])
    model = onnx_compose.merge_models(first, post, io_map=[(RAW_NAME, RAW_NAME), ("geometry", "geometry")])
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        opsets[imp.domain] = max(opsets.get(imp.domain, 0), imp.version)
    del model.opset_import[:]
    model.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())
    onnx.checker.check_model(model, full_check=True)
    return model


class YoloReference(nn.Module):
    """The letterbox, the network and the decoding in PyTorch, for one uint8 RGB image `[H, W, 3]`:
    its detections (boxes as corners in its own pixels, scores, labels), best first."""

    def __init__(self, network: nn.Module, size: int, pad_value: int, score: float, iou: float, top: int) -> None:
        super().__init__()
        self.network, self.size, self.pad_value = network, size, pad_value
        self.score, self.iou, self.top = score, iou, top

    def letterbox(self, image: np.ndarray) -> tuple[torch.Tensor, tuple[float, int, int]]:
        height, width = image.shape[:2]
        scale, new_h, new_w, top, left = letterbox_geometry(height, width, self.size)
        x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)[None].float()
        x = torch.nn.functional.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
        pads = (left, self.size - new_w - left, top, self.size - new_h - top)
        x = torch.nn.functional.pad(x, pads, value=float(self.pad_value))
        return x / 255.0, (scale, top, left)

    @torch.inference_mode()
    def forward(self, image: np.ndarray) -> dict[str, np.ndarray]:
        from torchvision.ops import batched_nms

        height, width = image.shape[:2]
        pixels, (scale, top, left) = self.letterbox(image)
        raw = self.network(pixels)[0]  # [4 + classes, anchors]
        centre, scores = raw[:4].T, raw[4:].T  # [A, 4], [A, C]
        anchor, label = torch.nonzero(scores > self.score, as_tuple=True)
        kept_scores = scores[anchor, label]
        box = centre[anchor]
        corners = torch.cat([box[:, :2] - box[:, 2:] / 2, box[:, :2] + box[:, 2:] / 2], dim=1)
        keep = batched_nms(corners, kept_scores, label, self.iou)[: self.top]
        offset = torch.tensor([left, top, left, top], dtype=corners.dtype)
        limit = torch.tensor([width, height, width, height], dtype=corners.dtype)
        boxes = torch.minimum(((corners[keep] - offset) / scale).clamp(min=0), limit)
        return {
            BOXES: boxes.numpy().astype(np.float32),
            SCORES: kept_scores[keep].numpy().astype(np.float32),
            LABELS: label[keep].numpy().astype(np.int64),
        }
