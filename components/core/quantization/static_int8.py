"""Static int8 for the image families: graphs that run on ONNX Runtime's int8 kernels, and
accuracy-aware mixed precision chosen by the task's own gate.

The steps, each measured (docs/build.md "int8 for images"):

1. **Prepare** (`prepare`): ONNX Runtime's `quant_pre_process` (shape inference, then its basic graph
   optimizations: Identity removal, constant folding, Conv+BatchNorm fusion) before quantizing. The
   TorchScript exporter shares equal initializers through Identity nodes (random BatchNorm gives
   many equal biases); the quantizer cannot quantize a bias that is not an initializer, and ONNX
   Runtime fuses DequantizeLinear -> Conv -> QuantizeLinear into QLinearConv only with an int32
   bias. Without this step 47 of ResNet-50's 53 convolutions stayed float Conv between
   DequantizeLinear and QuantizeLinear, slower than fp32 (47.7 vs 40.3 ms); with it 53 of 53 are
   QLinearConv (13.8 ms).
2. **Calibrate once** (min/max over the calibration photos, cached for every candidate).
3. **Quantize** (`quantize`) with a `StaticInt8` recipe: per-channel weights, 8-bit where this
   CPU sums u8 x s8 exactly (VNNI, AMX), else 7-bit; uint8 activations; ReLU/Clip folded into
   their convolution's range; the pre/post-processing blocks stay fp32.
4. **Bias correction** (`correct_biases`): each convolution's bias absorbs the mean shift its
   rounded weights cause (weight error x the fp32 input's mean per channel).
5. **Mixed precision** (`search`): the task's gate judges each candidate; when the full int8 graph
   misses, the layers are ranked by what each costs the graph's outputs (`sensitivity`: the
   outputs' noise against fp32 on calibration photos, less the same with that layer in float)
   and the worst 1, 2, 4, 8... go back to float until the gate passes.

`kernel_census` counts what ONNX Runtime actually runs: int8 kernels, and float Conv/MatMul/Gemm
fed by dequantized weights (quantize/dequantize paid, float computed), which should be none.

What this does not do: AdaRound, cross-layer equalization (it changes ReLU6 networks), 16-bit
activations (ONNX Runtime's CPU convolutions have no kernel for them), quantization-aware training.
onnx and onnxruntime load inside the functions.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ortpack.components.core.quantization.graph_recipes import FP32_NODE_PREFIXES
from ortpack.components.core.quantization.graph_recipes import fp32_nodes as blocks_kept_fp32
from ortpack.components.core.quantization.recipes import PINNED_RULE, STATIC_INT8_RECIPES, StaticInt8
from ortpack.kernel.hardware import this_machine
from ortpack.kernel.runtime import DISABLED_OPTIMIZERS

log = logging.getLogger("ortpack.optimize")

# The operators quantized: convolutions, and the activations folded into their output range; a
# "wide" recipe also the operators between convolutions that ONNX Runtime has int8 kernels for
QUANTIZED_OPS = ("Conv", "Clip", "Relu")
WIDE_OPS = ("Add", "Concat", "MaxPool", "Resize", "GlobalAveragePool", "Mul", "Sigmoid")
# Images the sensitivity ranking runs, once per quantized layer (the int8 graph simulated in float)
SENSITIVITY_IMAGES = 8
# Layers returned to float at most: a quarter of the quantized ones (beyond that int8 saves little),
# and at least two
MAX_FLOAT_SHARE = 0.25
RULE = (
    "the first candidate within the int8 gate, fastest first: the operators between convolutions in "
    "int8 too, then the convolutions alone, then the fewest layers in float"
)
# ONNX Runtime's integer operators (what a quantized graph should run) and the float ones that
# should not be fed by a DequantizeLinear of a constant weight
INT8_KERNELS = (
    "QLinearConv",
    "ConvInteger",
    "QLinearMatMul",
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "QGemm",
    "QAttention",
    "QLinearAdd",
    "QLinearMul",
    "QLinearConcat",
    "QLinearGlobalAveragePool",
    "QLinearAveragePool",
    "QLinearSigmoid",
    "QLinearLeakyRelu",
)
FLOAT_COMPUTE = ("Conv", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "FusedGemm", "ConvTranspose")


def weight_bits_here() -> int:
    """8 where this CPU sums u8 x s8 products exactly (VNNI, AMX), else 7 (kernel/hardware.py)."""
    return 8 if this_machine().exact_int8_dot else 7


def prepare(src: Path, dst: Path) -> None:
    """ONNX Runtime's quantization pre-processing: symbolic shape inference (plain ONNX shape
    inference where the symbolic one cannot finish, e.g. a letterbox whose sizes depend on the
    photo), then its basic optimizations. Node names are kept, so `pre/` and `post/` still say
    what stays fp32. Run from a scratch directory: a failed symbolic inference writes its partial
    model into the working directory."""
    import contextlib
    import tempfile

    from onnxruntime.quantization.shape_inference import quant_pre_process

    src, dst = Path(src).absolute(), Path(dst).absolute()
    with tempfile.TemporaryDirectory(prefix="ortpack-prepare-") as tmp, contextlib.chdir(tmp):
        try:
            quant_pre_process(str(src), str(dst))
        except Exception as exc:  # noqa: BLE001 (onnxruntime raises a bare Exception for incomplete inference)
            log.debug("int8: symbolic shape inference failed (%s); using ONNX shape inference", exc)
            quant_pre_process(str(src), str(dst), skip_symbolic_shape=True)


def quantizable_convolutions(graph: Any) -> list[str]:
    """The convolutions int8 may quantize, in graph order (not in the pre/post blocks)."""
    return [n.name for n in graph.node if n.op_type == "Conv" and not n.name.startswith(FP32_NODE_PREFIXES)]


def fp32_nodes(graph: Any) -> list[str]:
    """Nodes that stay fp32: what fp16 keeps in fp32 too (the pre/post-processing blocks, whatever
    produces a graph output: graph_recipes.fp32_nodes), and the network's own outputs where the
    post-processing reads them (a detector's boxes and class scores concatenated: one int8 scale for
    pixel coordinates and logits left no detection standing)."""
    read_by_post = {name for n in graph.node if n.name.startswith("post/") for name in n.input}
    read = [n.name for n in graph.node if set(n.output) & read_by_post]
    return list(dict.fromkeys([*blocks_kept_fp32(graph), *read]))


def quantize(
    prepared: Path,
    dst: Path,
    images: Sequence[np.ndarray],
    recipe: StaticInt8,
    *,
    float_layers: Sequence[str] = (),
    cache: Path | None = None,
    means: dict[str, np.ndarray] | None = None,
) -> None:
    """QDQ int8 of `prepared` (see `prepare`) with `recipe`, calibrated by min/max on `images`
    (uint8 [H, W, 3] each, fed at batch 1) or read from `cache` (written on the first call);
    `float_layers` stay float; biases corrected when the recipe says so (`means`: the
    convolutions' fp32 input means, `input_means`, when the caller has them already)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Images(CalibrationDataReader):
        def __init__(self) -> None:
            self.images = iter(images)

        def get_next(self) -> dict[str, Any] | None:
            image = next(self.images, None)
            return None if image is None else {"images": image[None]}

    graph = onnx.load(str(prepared), load_external_data=False).graph
    target = dst if not recipe.bias_correction else dst.with_name(dst.stem + ".uncorrected.onnx")
    quantize_static(
        str(prepared),
        str(target),
        Images(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        reduce_range=recipe.weight_bits <= 7,
        op_types_to_quantize=[*QUANTIZED_OPS, *(WIDE_OPS if recipe.activations else ())],
        nodes_to_exclude=fp32_nodes(graph) + list(float_layers),
        calibration_cache_path=str(cache) if cache else None,
    )
    if recipe.bias_correction:
        correct_biases(prepared, target, dst, images if means is None else means)
        target.unlink()


@dataclass(frozen=True)
class _QuantizedConv:
    """A convolution of a QDQ graph whose input, weight and bias come from DequantizeLinear."""

    node: Any
    weight_dq: Any
    bias_dq: Any


def _quantized_convolutions(model: Any) -> list[_QuantizedConv]:
    producer = {out: node for node in model.graph.node for out in node.output}
    found = []
    for node in model.graph.node:
        if node.op_type != "Conv" or len(node.input) < 3:
            continue
        dqs = [producer.get(name) for name in node.input[:3]]
        if all(dq is not None and dq.op_type == "DequantizeLinear" for dq in dqs):
            found.append(_QuantizedConv(node, dqs[1], dqs[2]))
    return found


def _session_with_outputs(model: Any, names: Sequence[str]) -> Any:
    """A CPU session of `model` that also returns the tensors `names` (basic optimizations only:
    a QDQ graph then runs simulated in float, its convolutions visible)."""
    import onnx
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _channel_means(model: Any, names: Sequence[str], images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """Each tensor's mean per channel (axis 1) over `images`, run one at a time."""
    names = sorted(set(names))
    session = _session_with_outputs(model, names)
    sums: dict[str, np.ndarray] = {}
    for image in images:
        for name, value in zip(names, session.run(names, {"images": image[None]}), strict=True):
            axes = tuple(i for i in range(value.ndim) if i != 1)
            mean = value.astype(np.float64).mean(axis=axes)
            sums[name] = sums[name] + mean if name in sums else mean
    return {name: total / len(images) for name, total in sums.items()}


def input_means(prepared: Path, images: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """The mean per channel of every quantizable convolution's input in the fp32 graph `prepared`,
    over `images` (one fp32 pass): what bias correction needs, the same for every candidate."""
    import onnx

    fp32 = onnx.load(str(prepared))
    convs = set(quantizable_convolutions(fp32.graph))
    return _channel_means(fp32, [n.input[0] for n in fp32.graph.node if n.name in convs], images)


def correct_biases(prepared: Path, qdq: Path, dst: Path, images: Sequence[np.ndarray] | dict[str, np.ndarray]) -> int:
    """Write `qdq` to `dst` with every quantized convolution's int32 bias shifted by the mean its
    rounded weights move the output: (w_q - w) . E[x] per output channel, E[x] the fp32 input's
    mean per channel over `images` (one fp32 pass; or `images` are those means already, from
    `input_means`). Returns how many biases changed. Cheap and
    safe (it never sees the int8 graph's own drift, so it cannot chase noise): measured on
    EfficientNet-Lite0 in 0.8 s, where correcting against the simulated int8 graph layer by layer
    took 22 s and, on YOLOv8s, drove the class scores up until every box was a detection."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(qdq))
    fp32 = onnx.load(str(prepared))
    fp32_nodes_ = {n.name: n for n in fp32.graph.node}
    fp32_weights = {i.name: i for i in fp32.graph.initializer}
    constants = {i.name: i for i in model.graph.initializer}
    convs = [c for c in _quantized_convolutions(model) if c.node.name in fp32_nodes_]
    inputs = [fp32_nodes_[c.node.name].input[0] for c in convs]
    means = images if isinstance(images, dict) else _channel_means(fp32, inputs, images)
    changed = 0
    for conv in convs:
        original = fp32_nodes_[conv.node.name]
        if original.input[1] not in fp32_weights or conv.bias_dq.input[0] not in constants:
            continue
        w = numpy_helper.to_array(fp32_weights[original.input[1]]).astype(np.float64)
        q = numpy_helper.to_array(constants[conv.weight_dq.input[0]]).astype(np.float64)
        scale = numpy_helper.to_array(constants[conv.weight_dq.input[1]]).astype(np.float64)
        zero = (
            numpy_helper.to_array(constants[conv.weight_dq.input[2]]).astype(np.float64)
            if len(conv.weight_dq.input) > 2 and conv.weight_dq.input[2]
            else np.zeros_like(scale)
        )
        per_channel = (-1,) + (1,) * (w.ndim - 1)
        error = ((q - zero.reshape(per_channel)) * scale.reshape(per_channel) - w).sum(axis=tuple(range(2, w.ndim)))
        groups = next((a.i for a in conv.node.attribute if a.name == "group"), 1)
        out_channels, in_per_group = error.shape
        x_mean = means[original.input[0]].reshape(groups, in_per_group)
        group_of = np.arange(out_channels) // (out_channels // groups)
        shift = np.einsum("oi,oi->o", error, x_mean[group_of])
        bias = constants[conv.bias_dq.input[0]]
        bias_scale = numpy_helper.to_array(constants[conv.bias_dq.input[1]]).astype(np.float64)
        values = numpy_helper.to_array(bias).astype(np.int64) - np.rint(shift / bias_scale).astype(np.int64)
        limit = np.iinfo(np.int32)
        bias.CopyFrom(numpy_helper.from_array(np.clip(values, limit.min, limit.max).astype(np.int32), bias.name))
        changed += 1
    onnx.save(model, str(dst))
    return changed


def sensitivity(prepared: Path, qdq: Path, images: Sequence[np.ndarray]) -> dict[str, float]:
    """How much each quantized convolution of `qdq` costs the graph's outputs, by name: the
    outputs' noise-to-signal power against the fp32 graph `prepared` (summed over `images`), less
    the same with that one convolution in float (`_in_float`). Larger is worse. The int8 graph
    runs simulated (float convolutions on dequantized tensors); one session per layer.

    Measured on EfficientNet-Lite0 image embeddings with 7-bit weights: ranking layers by the noise
    each adds at its own output (noise-to-signal at its output less at its input, what ONNX
    Runtime's `qdq_loss_debug` compares) picked the linear bottleneck projections, and 8 of them in
    float left min cosine at 0.940; the stem and head convolutions alone gave 0.968, every
    depthwise convolution 0.982. What a layer costs the output is what the gate sees."""
    import onnx

    fp32, model = onnx.load(str(prepared)), onnx.load(str(qdq))
    outputs = [o.name for o in fp32.graph.output]
    feeds = [{"images": image[None]} for image in images]
    fp32_session = _session_with_outputs(fp32, [])
    reference = [fp32_session.run(outputs, feed) for feed in feeds]

    def error(candidate: Any) -> float:
        session = _session_with_outputs(candidate, [])
        noise = signal = 0.0
        for feed, expected in zip(feeds, reference, strict=True):
            for got, want in zip(session.run(outputs, feed), expected, strict=True):
                want = want.astype(np.float64)
                noise += float(((got.astype(np.float64) - want) ** 2).sum())
                signal += float((want**2).sum())
        return noise / signal if signal > 0 else 0.0

    fp32_weights = {i.name: i for i in fp32.graph.initializer}
    fp32_nodes_ = {n.name: n for n in fp32.graph.node}
    base = error(model)
    return {
        conv.node.name: base - error(_in_float(model, conv, fp32_nodes_[conv.node.name], fp32_weights))
        for conv in _quantized_convolutions(model)
        if conv.node.name in fp32_nodes_
    }


def _in_float(model: Any, conv: _QuantizedConv, original: Any, fp32_weights: dict[str, Any]) -> Any:
    """`model` with `conv` as `quantize(float_layers=[conv])` leaves it: its fp32 weight and bias;
    its input taken before quantization where the value comes from a float node (the photo's
    preprocessing, for the stem), its output passed on unquantized where only float nodes read it
    (pooling, for the head)."""
    import onnx

    copy = onnx.ModelProto.FromString(model.SerializeToString())
    graph = copy.graph
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    node = next(n for n in graph.node if n.name == conv.node.name)
    for slot in (1, 2):  # the weight and the bias, as the fp32 graph has them (renamed: a
        # DequantizeLinear of the int8 graph may write the fp32 name)
        if len(original.input) > slot and original.input[slot] in fp32_weights:
            constant = onnx.TensorProto()
            constant.CopyFrom(fp32_weights[original.input[slot]])
            constant.name = f"{original.input[slot]}/fp32"
            graph.initializer.append(constant)
            node.input[slot] = constant.name
    dq = producer.get(node.input[0])
    q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
    if q is not None and q.op_type == "QuantizeLinear":
        source = producer.get(q.input[0])
        if source is None or not _runs_quantized(source, producer, consumers):
            node.input[0] = q.input[0]
    after = [c for c in consumers.get(node.output[0], []) if c.op_type == "QuantizeLinear"]
    for q_out in after:
        for dq_out in [c for c in consumers.get(q_out.output[0], []) if c.op_type == "DequantizeLinear"]:
            readers = consumers.get(dq_out.output[0], [])
            if readers and not any(_runs_quantized(r, producer, consumers) for r in readers):
                for reader in readers:
                    reader.input[:] = [node.output[0] if i == dq_out.output[0] else i for i in reader.input]
    return copy


def _runs_quantized(node: Any, producer: dict[str, Any], consumers: dict[str, list[Any]]) -> bool:
    """A node of a QDQ graph between DequantizeLinear and QuantizeLinear (what ONNX Runtime fuses
    into an int8 kernel): its first input dequantized, its outputs read only by QuantizeLinear."""
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") or not node.input:
        return False
    first = producer.get(node.input[0])
    readers = [c for out in node.output for c in consumers.get(out, [])]
    return (
        first is not None
        and first.op_type == "DequantizeLinear"
        and bool(readers)
        and all(r.op_type == "QuantizeLinear" for r in readers)
    )


def kernel_census(path: Path, *, level: str = "disabled") -> dict[str, Any]:
    """What ONNX Runtime runs for the graph at `path` loaded at optimization `level` ("disabled":
    how a server loads an offline-optimized variant; "extended" or "all"): int8 kernels by
    operator, float compute by operator, and the float Conv/MatMul/Gemm nodes fed by a
    DequantizeLinear of a constant weight (`dequantized_float`: quantize/dequantize paid, float
    computed)."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="ortpack-census-") as tmp:
        seen = Path(tmp) / "session.onnx"
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[level]
        options.optimized_model_filepath = str(seen)
        ort.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_OPTIMIZERS
        )
        graph = onnx.load(str(seen), load_external_data=False).graph
    constants = {i.name for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    ops = Counter(node.op_type for node in graph.node)
    dequantized = [
        node.name
        for node in graph.node
        if node.op_type in FLOAT_COMPUTE
        and len(node.input) > 1
        and (dq := producer.get(node.input[1])) is not None
        and dq.op_type == "DequantizeLinear"
        and dq.input[0] in constants
    ]
    return {
        "int8": {op: ops[op] for op in INT8_KERNELS if ops[op]},
        "float": {op: ops[op] for op in FLOAT_COMPUTE if ops[op]},
        "dequantized_float": dequantized,
    }


Judge = Callable[[Path], tuple[dict[str, float], list[str]]]


def search(
    src: Path,
    dst: Path,
    images: Sequence[np.ndarray],
    judge: Judge,
    rank: Callable[[dict[str, float]], Any],
    *,
    weight_bits: int | None = None,
) -> dict[str, Any]:
    """The image families' int8: `src` prepared and calibrated once, then candidates judged by
    `judge(candidate) -> (quality, gate misses)`, fastest first:

    1. every convolution int8 with this CPU's weight width (`weight_bits`, default
       `weight_bits_here()`) and the operators between them too ("wide"), biases corrected, then
       not; then the convolutions alone, corrected, then not;
    2. when all four miss: the best of them (by `rank` of their quality) with the 1, 2, 4, 8...
       most sensitive layers (`sensitivity`) in float, up to a quarter of them (at least two).

    The first without a miss is copied to `dst`; when none passes, the best by `rank` (the
    validate step reports its miss). Returns what the optimize step records as `metrics["int8"]`:
    the recipe, the rule, every candidate's quality, the layers kept in float with their measured
    sensitivity, the weight width and the calibration."""
    bits = weight_bits or weight_bits_here()
    work = dst.parent
    prepared = work / f"{dst.stem}.prepared.onnx"
    cache = work / f"{dst.stem}.calibration.json"
    prepare(src, prepared)
    means = input_means(prepared, images)  # the corrected candidates all read them
    paths: dict[str, Path] = {}
    tried: dict[str, dict[str, Any]] = {}
    float_sets: dict[str, dict[str, float]] = {}

    def attempt(name: str, recipe: StaticInt8, floats: dict[str, float]) -> bool:
        path = work / f"{dst.stem}.{name}.onnx"
        quantize(prepared, path, images, recipe, float_layers=list(floats), cache=cache, means=means)
        quality, misses = judge(path)
        paths[name], float_sets[name] = path, floats
        tried[name] = {
            "quality": {k: round(float(v), 6) for k, v in quality.items()},
            "passed": not misses,
            "misses": misses,
            "mb": round(path.stat().st_size / 1e6, 2),
            "float_layers": len(floats),
        }
        log.info("int8 candidate %s: %s", name, "; ".join(misses) if misses else "within the gate")
        return not misses

    whole = [StaticInt8(bits, correct, wide) for wide in (True, False) for correct in (True, False)]
    chosen = next((r.name for r in whole if attempt(r.name, r, {})), None)
    base = whole[0]
    ranking: dict[str, float] = {}
    if chosen is None:
        import onnx

        base = max(whole, key=lambda r: rank(tried[r.name]["quality"]))
        ranking = sensitivity(prepared, paths[base.name], images[:SENSITIVITY_IMAGES])
        worst = sorted(ranking, key=lambda layer: -ranking[layer])
        total = len(quantizable_convolutions(onnx.load(str(prepared), load_external_data=False).graph))
        count = 1
        while count <= max(2, int(total * MAX_FLOAT_SHARE)) and chosen is None:
            name = f"{base.name}+{count}fp32"
            if attempt(name, base, {layer: ranking[layer] for layer in worst[:count]}):
                chosen = name
            count *= 2
    passed = chosen is not None
    if chosen is None:
        chosen = max(tried, key=lambda n: rank(tried[n]["quality"]))
        log.warning("int8: no candidate is within the gate; keeping %s (the validate step reports it)", chosen)
    shutil.copyfile(paths[chosen], dst)
    recipe = next((r for r in whole if r.name == chosen), base)
    for path in [*paths.values(), prepared, cache]:
        path.unlink(missing_ok=True)
    return {
        "recipe": recipe.name,
        "candidate": chosen,
        "rule": RULE,
        "passed": passed,
        "candidates": tried,
        "weight_bits": bits,
        "bias_correction": recipe.bias_correction,
        "calibration": f"min/max over {len(images)} images",
        "float_layers": {k: round(v, 6) for k, v in float_sets[chosen].items()},
        "sensitivity": {k: round(v, 6) for k, v in sorted(ranking.items(), key=lambda kv: -kv[1])},
    }


def build(src: Path, dst: Path, images: Sequence[np.ndarray], recipe_name: str) -> dict[str, Any]:
    """A pinned recipe (`--int8-recipe`): `src` prepared and quantized with it, every
    convolution int8, nothing searched (the validate step gates it)."""
    recipe = STATIC_INT8_RECIPES[recipe_name]
    prepared = dst.with_name(f"{dst.stem}.prepared.onnx")
    prepare(src, prepared)
    quantize(prepared, dst, images, recipe)
    prepared.unlink()
    return {
        "weight_bits": recipe.weight_bits,
        "bias_correction": recipe.bias_correction,
        "calibration": f"min/max over {len(images)} images",
        "float_layers": {},
    }


def family_int8(
    src: Path,
    dst: Path,
    images: Sequence[np.ndarray],
    pinned: str | None,
    judge: Judge,
    rank: Callable[[dict[str, float]], Any],
) -> dict[str, Any]:
    """An image family's int8 step: the `pinned` recipe built alone, else `search`. Returns the
    optimize step's `metrics["int8"]` (and `passed`: whether a searched candidate met the gate)."""
    if pinned:
        return {"recipe": pinned, "rule": PINNED_RULE, "candidates": {}, **build(src, dst, images, pinned)}
    return search(src, dst, images, judge, rank)
