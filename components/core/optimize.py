"""Step 2: optimize a raw export offline for one variant (a target preset x a precision).

The sequence is: ONNX Runtime's transformer fusions (Attention, SkipLayerNormalization,
BiasGelu, EmbedLayerNormalization) for known encoder families; the precision conversion (fp16
with fp32 inputs/outputs and the pooling block kept in fp32, or int8 dynamic per-channel
quantization); then ORT's own graph optimization at the target's offline level, saved to disk.

What this does not do: TensorRT engines, or ORT-level offline optimization for CUDA (that needs a
GPU session; the server enables online optimization for such variants instead).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from components.core.artifacts import ExportResult, OptimizeResult
from components.core.errors import UnsupportedHereError
from components.core.specs import VariantSpec, get_target

log = logging.getLogger("ortpack.optimize")

# Hugging Face model_type -> the onnxruntime.transformers optimizer that fuses it.
FUSION_MODEL_TYPES = {
    "bert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
    "distilbert": "bert",
    "electra": "bert",
    "camembert": "bert",
    "mpnet": "bert",
}
# The post-processing block of text graphs (see exporters.text_embedding.Pooling): kept in fp32.
FP32_NODE_PREFIXES = ("/pooling/",)
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


def _fuse(raw: Path, export: ExportResult, use_gpu: bool) -> tuple[Any, dict[str, int]]:
    """Apply the transformer fusions when the family is known; return (OnnxModel, fusions)."""
    import onnx
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.onnx_model import OnnxModel

    family = FUSION_MODEL_TYPES.get(str(export.model_info.get("model_type", "")))
    if export.task != "text-embedding" or family is None:
        return OnnxModel(onnx.load(str(raw))), {}
    model = optimizer.optimize_model(
        str(raw),
        model_type=family,
        num_heads=int(export.model_info["num_heads"]),
        hidden_size=int(export.model_info["hidden_size"]),
        opt_level=0,  # python fusions only; ORT's own optimizations are applied below
        use_gpu=use_gpu,
    )
    fusions = {op: n for op, n in (model.get_fused_operator_statistics() or {}).items() if n}
    return model, fusions


def _to_fp16(model: Any) -> None:
    """fp16 weights and compute; graph inputs/outputs and the pooling block stay fp32."""
    blocked = [n.name for n in model.model.graph.node if n.name.startswith(FP32_NODE_PREFIXES)]
    model.convert_float_to_float16(keep_io_types=True, node_block_list=blocked)


def _quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization, per-channel weights (the per-tensor variant loses too much)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Attention", "Conv"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


def ort_offline_optimize(src: Path, dst: Path, level: str, providers: list[str]) -> None:
    """Run ORT's graph optimizations once and save the result, so servers skip them at start."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[level])
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=providers)


def optimize_model(export_dir: Path, variant: VariantSpec, out_dir: Path) -> OptimizeResult:
    """Build one variant from the raw export in `export_dir` into `out_dir/model.onnx`."""
    import onnx
    import onnxruntime as ort

    export_dir, out_dir = Path(export_dir), Path(out_dir)
    export = ExportResult.load(export_dir)
    target = get_target(variant.target)
    raw = export_dir / export.model_file
    out_dir.mkdir(parents=True, exist_ok=True)
    available = ort.get_available_providers()
    t0 = time.perf_counter()
    nodes_before = len(onnx.load(str(raw), load_external_data=False).graph.node)

    with tempfile.TemporaryDirectory(prefix="ortpack-opt-") as tmp:
        work = Path(tmp)
        model, fusions = _fuse(raw, export, target.use_gpu_fusions)
        if variant.precision == "fp16":
            _to_fp16(model)
        staged = work / "staged.onnx"
        model.save_model_to_file(str(staged))
        if variant.precision == "int8":
            quantized = work / "int8.onnx"
            _quantize_int8(staged, quantized)
            staged = quantized
        final = out_dir / "model.onnx"
        if target.offline_optimization_level == "disabled":
            shutil.copyfile(staged, final)
        else:
            if not set(target.execution_providers) <= set(available):
                raise UnsupportedHereError(
                    f"target {target.name!r} needs {target.execution_providers}; this onnxruntime has {available}"
                )
            ort_offline_optimize(staged, final, target.offline_optimization_level, list(target.execution_providers))

    optimized = onnx.load(str(final), load_external_data=False)
    seconds = time.perf_counter() - t0
    result = OptimizeResult(
        variant_id=variant.id,
        target=target.name,
        precision=variant.precision,
        execution_providers=list(target.execution_providers),
        ort_version=ort.__version__,
        opset=export.opset,
        offline_optimization_level=target.offline_optimization_level,
        metrics={
            "nodes_before": nodes_before,
            "nodes_after": len(optimized.graph.node),
            "fusions": fusions,
            "ops_after": op_histogram(optimized),
            "mb": final.stat().st_size / 1e6,
            "seconds": seconds,
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
