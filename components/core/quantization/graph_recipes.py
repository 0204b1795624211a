"""Graph recipes: the transformer fusions and the precision conversions a task family applies to
an ONNX graph (fp16 with the pre/post-processing kept in fp32, dynamic int8 with per-token rows).
Static int8 for the image families is components/core/quantization/static_int8.py.

The optimize step (`ortpack.components.core.optimize`) and the task families (`ortpack.components.core.tasks`)
call these; this module imports neither (nor the benchmark step), only the recipe table
(`ortpack.components.core.quantization.recipes`). onnx and onnxruntime load inside the functions.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortpack.components.core.quantization.recipes import PER_CHANNEL, DynamicInt8

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult

log = logging.getLogger("ortpack.optimize")
# Fuser name (`EncoderFamily.fuser`, recorded by the exporter in export.json's model_info) -> the
# onnxruntime.transformers optimizer model_type it runs, or None for the onnxscript rewriter.
FUSION_MODEL_TYPES: dict[str, str | None] = {"ort-bert": "bert", "onnxscript": None}
# Kept in fp32 (and out of int8): the pooling block of text graphs (exporters.text_embedding.Pooling),
# the preprocessing of image graphs (exporters.image_common, nodes prefixed "pre/") and the
# post-processing an exporter builds after the network (box decoding and NMS: "post/").
FP32_NODE_PREFIXES = ("/pooling/", "pre/", "post/")


def fuse_graph(raw: Path, export: ExportResult, use_gpu: bool) -> tuple[Any, dict[str, int], str]:
    """Apply the transformer fusions the exporter recorded for the model's encoder family
    (`model_info["fuser"]`: "ort-bert", "onnxscript" or "none"); return (OnnxModel, fusions, fuser).

    `fusions` counts the fused operators in the result: onnxruntime.transformers' own statistics
    for "ort-bert", the contrib (com.microsoft) operators the onnxscript rewriter produced for
    "onnxscript", nothing for "none" (the graph still ships when its gate passes)."""
    import onnx
    from onnxruntime.transformers.onnx_model import OnnxModel

    fuser = str(export.model_info.get("fuser", "none"))
    if fuser not in FUSION_MODEL_TYPES:
        return OnnxModel(onnx.load(str(raw))), {}, "none"
    ort_model_type = FUSION_MODEL_TYPES[fuser]
    if ort_model_type is not None:
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(
            str(raw),
            model_type=ort_model_type,
            num_heads=int(export.model_info["num_heads"]),
            hidden_size=int(export.model_info["hidden_size"]),
            opt_level=0,  # python fusions only; ORT's own optimizations are applied below
            use_gpu=use_gpu,
        )
        fusions = {op: n for op, n in (model.get_fused_operator_statistics() or {}).items() if n}
        return model, fusions, fuser
    from onnxscript import ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    fused, _ = optimize_for_ort(ir.load(str(raw)))
    proto = ir.serde.serialize_model(fused)
    counts = Counter(node.op_type for node in proto.graph.node if node.domain == "com.microsoft")
    return OnnxModel(proto), dict(sorted(counts.items())), fuser


def fp32_nodes(graph: Any) -> list[str]:
    """Nodes that stay fp32: pre/post-processing blocks and whatever produces a graph output."""
    outputs = {o.name for o in graph.output}
    return [n.name for n in graph.node if n.name.startswith(FP32_NODE_PREFIXES) or set(n.output) & outputs]


def to_fp16(model: Any) -> None:
    """fp16 weights and compute; graph inputs/outputs and the pre/post-processing stay fp32."""
    model.convert_float_to_float16(keep_io_types=True, node_block_list=fp32_nodes(model.model.graph))


def ffn_output_matmuls(graph: Any) -> list[str]:
    """MatMuls with a constant B of shape [K, N], K > N: the projections back from a wider
    intermediate (the FFN's second MatMul in every encoder family here)."""
    constants = {init.name: init for init in graph.initializer}
    return [
        node.name
        for node in graph.node
        if node.op_type == "MatMul"
        and node.input[1] in constants
        and len(constants[node.input[1]].dims) == 2
        and constants[node.input[1]].dims[0] > constants[node.input[1]].dims[1]
    ]


def quantize_int8_dynamic(
    src: Path, dst: Path, *, per_token: Sequence[str] = (), recipe: DynamicInt8 = PER_CHANNEL
) -> None:
    """Dynamic int8 quantization with 7-bit weights (`reduce_range`), per channel unless the
    `recipe` says otherwise; the MatMuls whose node names match a `per_token` regex quantize their
    activations per token instead of per tensor (`_per_token_matmuls`).

    7 bits, not 8, because the numbers must not depend on the CPU: without AVX-512 VNNI (or
    AVX-VNNI, AMX) ONNX Runtime's u8 x s8 kernels add pairs of products in saturating int16, and
    255 * 127 * 2 overflows it while 255 * 64 * 2 does not; with 7-bit weights every x86-64 CPU
    computes the exact integer result (tests/components/test_hardware.py emulates it). Measured on
    all-MiniLM-L6-v2 (Xeon with AMX, one run): 8-bit weights min cosine 0.954 / mean 0.9914 /
    neighbours 0.918, b1x16 1.21 ms, b16x128 94 ms; 7-bit 0.949 / 0.9897 / 0.915, 1.29 ms,
    100 ms; u8 x u8 (also saturation-free) 0.948 / 0.9916 / 0.921 but 2.13 ms and 225 ms;
    per-tensor 7-bit missed the gate (min cosine 0.33).

    Per token, because one activation scale per tensor fails when a few tokens carry activations
    tens of times larger than the rest: all-mpnet-base-v2's second FFN MatMul sees GELU outputs
    of 70-100 at its delimiter tokens (<s>, </s>, ".") in layers 6-10 against ~2.5 elsewhere, so
    every other token keeps a handful of levels (min cosine 0.58, mean 0.86, neighbours 0.73).
    Each row then gets its own scale and zero point: the family table
    (`ortpack.components.core.exporters.families`, `int8_per_token`) says where.
    """
    import re

    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(src), load_external_data=False).graph
    constants = {init.name for init in graph.initializer}
    fp32 = set(ffn_output_matmuls(graph)) if recipe.fp32_ffn_output else set()
    rows = {
        node.name
        for node in graph.node
        if node.op_type == "MatMul"
        and node.input[1] in constants
        and node.name not in fp32
        and any(re.search(pattern, node.name) for pattern in per_token)
    }
    ops = ["MatMul", "Attention", "Conv"]
    if recipe.int8_embeddings:
        ops += ["EmbedLayerNormalization", "Gather"]
    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=recipe.per_channel,
        reduce_range=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=ops,
        nodes_to_exclude=sorted(rows | fp32),
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    if rows:
        model = onnx.load(str(dst))
        _per_token_matmuls(model, rows)
        onnx.save(model, str(dst))


def _per_token_matmuls(model: Any, names: set[str]) -> None:
    """Replace each fp32 MatMul in `names` (B a constant [K, N]) by dynamic int8 with one scale
    and zero point per row of A (per token), and B's 7-bit per-column weights (|w| <= 64, so the
    u8 x s8 products are exact on every x86-64 CPU, as in `quantize_int8_dynamic`):

        scale = (max(row, 0) - min(row, 0)) / 255      zero = round(-min(row, 0) / scale)
        q = clip(round(a / scale) + zero, 0, 255)      u8, shared by MatMuls of the same A
        y = (MatMulInteger(q, w_q) - zero * sum_k w_q) * scale * w_scale

    MatMulInteger takes only a per-tensor zero point for A, so each row's zero point is taken
    out in int32 afterwards (exact). The rounding follows DynamicQuantizeLinear's."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    added: list[Any] = []
    nodes: list[Any] = []
    quantized_inputs: dict[str, tuple[str, str, str]] = {}

    def constant(name: str, value: Any) -> str:
        added.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)

    def reduce(op: str, x: str, out: str, name: str) -> Any:  # over the last axis, kept
        if opset >= 18:  # axes became an input
            return helper.make_node(op, [x, constant(f"{name}/axes", np.array([-1], np.int64))], [out], name=name)
        return helper.make_node(op, [x], [out], keepdims=1, axes=[-1], name=name)

    for node in graph.node:
        if node.op_type != "MatMul" or node.name not in names:
            nodes.append(node)
            continue
        a, out = node.input[0], node.output[0]
        if a not in quantized_inputs:
            p = f"{a}_token_q"
            zero, top = constant(f"{p}/0", np.float32(0)), constant(f"{p}/255", np.float32(255))
            tiny = constant(f"{p}/tiny", np.float32(1e-30))
            nodes += [
                reduce("ReduceMin", a, f"{p}/min0", f"{p}/ReduceMin"),
                reduce("ReduceMax", a, f"{p}/max0", f"{p}/ReduceMax"),
                helper.make_node("Min", [f"{p}/min0", zero], [f"{p}/min"], name=f"{p}/Min"),
                helper.make_node("Max", [f"{p}/max0", zero], [f"{p}/max"], name=f"{p}/Max"),
                helper.make_node("Sub", [f"{p}/max", f"{p}/min"], [f"{p}/range"], name=f"{p}/Sub"),
                helper.make_node("Div", [f"{p}/range", top], [f"{p}/scale0"], name=f"{p}/DivRange"),
                helper.make_node("Max", [f"{p}/scale0", tiny], [f"{p}/scale"], name=f"{p}/MaxTiny"),
                helper.make_node("Div", [f"{p}/min", f"{p}/scale"], [f"{p}/zero_neg"], name=f"{p}/DivMin"),
                helper.make_node("Round", [f"{p}/zero_neg"], [f"{p}/zero_neg_r"], name=f"{p}/RoundZero"),
                helper.make_node("Neg", [f"{p}/zero_neg_r"], [f"{p}/zero"], name=f"{p}/Neg"),
                helper.make_node("Div", [a, f"{p}/scale"], [f"{p}/scaled"], name=f"{p}/Div"),
                helper.make_node("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
                helper.make_node("Add", [f"{p}/rounded", f"{p}/zero"], [f"{p}/shifted"], name=f"{p}/Add"),
                helper.make_node("Clip", [f"{p}/shifted", zero, top], [f"{p}/clipped"], name=f"{p}/Clip"),
                helper.make_node("Cast", [f"{p}/clipped"], [f"{p}/u8"], to=TensorProto.UINT8, name=f"{p}/Cast"),
                helper.make_node("Cast", [f"{p}/zero"], [f"{p}/zero_i32"], to=TensorProto.INT32, name=f"{p}/CastZero"),
            ]
            quantized_inputs[a] = (f"{p}/u8", f"{p}/scale", f"{p}/zero_i32")
        q, scale, zero_i32 = quantized_inputs[a]
        weights = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
        w_scale = np.abs(weights).max(axis=0) / 64.0
        w_scale[w_scale == 0] = 1.0
        w_q = np.clip(np.rint(weights / w_scale), -64, 64).astype(np.int8)
        p = f"{node.name}_token_q"
        w_name = constant(f"{p}/w_q", w_q)
        w_sum = constant(f"{p}/w_sum", w_q.astype(np.int32).sum(axis=0, dtype=np.int32))
        w_scale_name = constant(f"{p}/w_scale", w_scale.astype(np.float32))
        nodes += [
            helper.make_node("MatMulInteger", [q, w_name], [f"{p}/acc"], name=f"{p}/MatMulInteger"),
            helper.make_node("Mul", [zero_i32, w_sum], [f"{p}/offset"], name=f"{p}/MulZero"),
            helper.make_node("Sub", [f"{p}/acc", f"{p}/offset"], [f"{p}/exact"], name=f"{p}/SubZero"),
            helper.make_node("Cast", [f"{p}/exact"], [f"{p}/float"], to=TensorProto.FLOAT, name=f"{p}/Cast"),
            helper.make_node("Mul", [scale, w_scale_name], [f"{p}/scales"], name=f"{p}/MulScales"),
            helper.make_node("Mul", [f"{p}/float", f"{p}/scales"], [out], name=f"{p}/Mul"),
        ]
    used = {name for n in nodes for name in n.input}
    kept = [init for init in graph.initializer if init.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
