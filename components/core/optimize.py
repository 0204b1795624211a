"""Step 2: optimize a raw export offline for one variant (a target preset x a precision).

The sequence is: the transformer fusions the model's encoder family chose at export
(`ortpack.components.core.exporters.families`: ONNX Runtime's BERT optimizer, giving Attention,
SkipLayerNormalization, BiasGelu, EmbedLayerNormalization, or the onnxscript rewriter's ORT
fusions, which add MultiHeadAttention, RotaryEmbedding and RMS norms); the precision conversion (fp16
with fp32 inputs/outputs and the pooling block kept in fp32, or int8 dynamic per-channel
quantization); then ORT's own graph optimization at the target's offline level, saved to disk.
The fusions and precision conversions themselves live in `ortpack.components.core.quantization.graph_recipes`.

What this does not do: TensorRT engines, or ORT-level offline optimization for CUDA (that needs a
GPU session; the server enables online optimization for such variants instead).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

from ortpack.components.core.artifacts import ExportResult, OptimizeResult
from ortpack.components.core.benchmark import bench_feeds
from ortpack.components.core.errors import UnsupportedHereError
from ortpack.components.core.graph_files import copy_graph, data_file, graph_files, needs_external_data, remove_graph
from ortpack.components.core.quantization.graph_recipes import to_fp16
from ortpack.components.core.quantization.static_int8 import kernel_census
from ortpack.components.core.specs import ParityThresholds, VariantSpec, get_target
from ortpack.components.core.tasks import check_int8_recipe, get_family, thresholds_for
from ortpack.components.core.timing import measure_interleaved, timed
from ortpack.kernel.runtime import DISABLED_OPTIMIZERS

log = logging.getLogger("ortpack.optimize")

_ORT_LEVELS = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
_COUNTED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "EmbedLayerNormalization",
    "SkipLayerNormalization",
    "LayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QAttention",
    "MatMulInteger",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QLinearConv",
    "QLinearMatMul",
    "MatMulNBits",
    "GatherBlockQuantized",
    "GroupQueryAttention",
    "FusedConv",
    "FusedMatMul",
    "FusedGemm",
    "Conv",
    "MatMul",
    "Cast",
)


def op_histogram(model: Any) -> dict[str, int]:
    counts = Counter(node.op_type for node in model.graph.node)
    return {op: counts[op] for op in _COUNTED_OPS if counts.get(op)}


def choose_online_level(model_path: Path, export: ExportResult, providers: list[str]) -> str:
    """ "disabled" or "all": which online optimization level runs this offline-optimized graph
    faster here. ORT's CPU layout transformations (NCHWc) are never baked into a shipped graph, so
    a convolution net usually runs faster with "all" (EfficientNet-Lite0 fp32 at batch 1 / 8 x
    480x640: 8.5 / 77 ms against 11.1 / 123 ms), and a choice made by a noisy measurement can
    make fp32 slower than PyTorch eager. So both levels are timed interleaved (a busy moment slows
    both alike) at every benchmark shape, each by its fastest call, and "disabled" is kept only
    when it is faster at every shape by 5 % or more."""
    import onnxruntime as ort

    sessions = {}
    for level, ort_level in (("disabled", "ORT_DISABLE_ALL"), ("all", "ORT_ENABLE_ALL")):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, ort_level)
        options.log_severity_level = 3
        sessions[level] = ort.InferenceSession(
            str(model_path), options, providers=providers, disabled_optimizers=DISABLED_OPTIMIZERS
        )
    faster_disabled = []
    for _, feeds in bench_feeds(export).values():
        calls = {level: timed(partial(session.run, None, feeds)) for level, session in sessions.items()}
        stats = measure_interleaved(calls, warmup=1, min_iters=3, max_iters=30, budget_s=0.5, honour_quick=False)
        faster_disabled.append(stats["disabled"]["min_ms"] < 0.95 * stats["all"]["min_ms"])
    return "disabled" if all(faster_disabled) else "all"


def ort_offline_optimize(src: Path, dst: Path, level: str, providers: list[str]) -> None:
    """Run ORT's graph optimizations once and save the result, so servers skip them at start."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[level])
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    if data_file(src).is_file():  # weights beyond one protobuf file's 2 GB stay in a data file
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_file(dst).name)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(src), options, providers=providers, disabled_optimizers=DISABLED_OPTIMIZERS)


def optimize_model(
    export_dir: Path,
    variant: VariantSpec,
    out_dir: Path,
    *,
    int8_recipe: str | None = None,
    thresholds: ParityThresholds | None = None,
) -> OptimizeResult:
    """Build one variant from the raw export in `export_dir` into `out_dir/model.onnx`; an int8
    variant with the task's search (or first-that-passes loop), or with `int8_recipe` pinned
    (components/core/quantization/recipes.py; it applies to int8 variants only). A task that
    quantizes weights only (decoders) searches its int8 and int4 recipes against `thresholds`, the
    build's gate for the precision (default: the task's own)."""
    import onnx
    import onnxruntime as ort

    export_dir, out_dir = Path(export_dir), Path(out_dir)
    export = ExportResult.load(export_dir)
    check_int8_recipe(export.task, int8_recipe)
    target = get_target(variant.target)
    raw = export_dir / export.model_file
    out_dir.mkdir(parents=True, exist_ok=True)
    available = ort.get_available_providers()
    t0 = time.perf_counter()
    nodes_before = len(onnx.load(str(raw), load_external_data=False).graph.node)

    family = get_family(export.task)
    int8: dict[str, Any] | None = None
    int4: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="ortpack-opt-") as tmp:
        work = Path(tmp)
        if family.fuse is not None:
            model, fusions, fuser = family.fuse(raw, export, target.use_gpu_fusions)
            staged = work / "staged.onnx"
            model.save_model_to_file(str(staged), use_external_data_format=needs_external_data(model.model))
        elif variant.precision == "fp16":
            from onnxruntime.transformers.onnx_model import OnnxModel

            model, fusions, fuser = OnnxModel(onnx.load(str(raw))), {}, "none"
            staged = work / "staged.onnx"
        else:  # nothing to change before quantizing: the raw graph (and its data file) as it is
            fusions, fuser, staged = {}, "none", work / "raw" / raw.name
            staged.parent.mkdir()
            copy_graph(raw, staged)
        if variant.precision == "fp16":
            to_fp16(model)
            model.save_model_to_file(str(staged), use_external_data_format=needs_external_data(model.model))
        weight_only = family.quantize_weight_only
        if variant.precision in ("int8", "int4") and weight_only is not None:
            quantized = work / f"{variant.precision}.onnx"
            gate = thresholds or thresholds_for(export.task, variant.precision)
            pinned = int8_recipe if variant.precision == "int8" else None  # --int8-recipe pins int8 only
            record = weight_only(staged, quantized, export, export_dir, variant.precision, gate, pinned or None)
            int8, int4 = (record, None) if variant.precision == "int8" else (None, record)
            staged = quantized
        elif variant.precision == "int8":
            quantized = work / "int8.onnx"
            int8 = family.quantize_int8(staged, quantized, export, export_dir, int8_recipe or None)
            staged = quantized
        elif variant.precision == "int4":
            raise UnsupportedHereError(f"task {export.task} has no int4 variant")
        final = out_dir / "model.onnx"
        remove_graph(final)
        if target.offline_optimization_level == "disabled":
            copy_graph(staged, final)
        else:
            if not set(target.execution_providers) <= set(available):
                raise UnsupportedHereError(
                    f"target {target.name!r} needs {target.execution_providers}; this onnxruntime has {available}"
                )
            ort_offline_optimize(staged, final, target.offline_optimization_level, list(target.execution_providers))

    optimized = onnx.load(str(final), load_external_data=False)
    online = "all"
    if target.offline_optimization_level != "disabled":
        online = choose_online_level(final, export, list(target.execution_providers))
    if int8 is not None and "CPUExecutionProvider" in target.execution_providers:
        # what ONNX Runtime runs as the server loads this graph: int8 kernels, and no float
        # convolution or matmul fed by dequantized weights (quantize/dequantize paid for nothing)
        level = online if target.offline_optimization_level != "disabled" else "all"
        int8["kernels"] = kernel_census(final, level=level)
    seconds = time.perf_counter() - t0
    result = OptimizeResult(
        variant_id=variant.id,
        target=target.name,
        precision=variant.precision,
        execution_providers=list(target.execution_providers),
        ort_version=ort.__version__,
        opset=export.opset,
        offline_optimization_level=target.offline_optimization_level,
        online_optimization_level=online,
        metrics={
            "nodes_before": nodes_before,
            "nodes_after": len(optimized.graph.node),
            "fuser": fuser,
            "fusions": fusions,
            "ops_after": op_histogram(optimized),
            "mb": sum(f.stat().st_size for f in graph_files(final)) / 1e6,
            "seconds": seconds,
            **({"int8": int8} if int8 else {}),
            **({"int4": int4} if int4 else {}),
        },
    )
    result.save(out_dir)
    log.info(
        "optimize %s: %d -> %d nodes, %.1f MB in %.1f s",
        variant.id,
        nodes_before,
        result.metrics["nodes_after"],
        result.metrics["mb"],
        seconds,
    )
    return result
