"""KFP component: build one variant (target x precision) from a raw export."""

from kfp import dsl
from kfp.dsl import Input, Metrics, Model, Output

from components.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE)
def optimize_variant(
    exported: Input[Model],
    target: str,
    precision: str,
    variant: Output[Model],
    metrics: Output[Metrics],
    ort_version: str,
) -> None:
    """Optimize the export offline with ONNX Runtime for one target preset and precision.

    Args:
        exported: The export step's directory.
        target: Target preset: cpu or cuda.
        precision: fp32 or int8 (cpu); fp16 or fp32 (cuda).
        variant: Directory with model.onnx and optimize.json (what it was built for).
        metrics: optimize.nodes_before, optimize.nodes_after, optimize.mb, optimize.seconds,
            optimize.fusions.<op>.
        ort_version: The onnxruntime the image pins: part of the cache key, so results built with
            another onnxruntime are not reused.
    """
    from pathlib import Path

    from components.core.logs import log_to_stdout
    from components.core.optimize import optimize_model
    from components.core.specs import VariantSpec

    log_to_stdout()
    spec = VariantSpec(target=target, precision=precision)
    result = optimize_model(Path(exported.path), spec, Path(variant.path))
    for key in ("nodes_before", "nodes_after", "mb", "seconds"):
        metrics.log_metric(f"optimize.{key}", float(result.metrics[key]))
    for op, count in result.metrics["fusions"].items():
        metrics.log_metric(f"optimize.fusions.{op}", float(count))
    variant.metadata.update(
        {
            "variant_id": result.variant_id,
            "execution_providers": result.execution_providers,
            "ort_version": result.ort_version,
            "offline_optimization_level": result.offline_optimization_level,
        }
    )
