"""KFP component: build one variant (target x precision) from a raw export."""

from kfp import dsl
from kfp.dsl import Input, Metrics, Model, Output

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def optimize_variant(
    exported: Input[Model],
    target: str,
    precision: str,
    variant: Output[Model],
    metrics: Output[Metrics],
    ort_version: str,
    int8_recipe: str = "",
    thresholds: dict = {},  # noqa: B006 - KFP reads defaults from the signature
) -> None:
    """Optimize the export offline with ONNX Runtime for one target preset and precision.

    Args:
        exported: The export step's directory.
        target: Target preset: cpu or cuda.
        precision: fp32, int8 or int4 (cpu; int4 for text-generation); fp16 or fp32 (cuda).
        variant: Directory with model.onnx and optimize.json (what it was built for).
        metrics: optimize.nodes_before, optimize.nodes_after, optimize.mb, optimize.seconds,
            optimize.fusions.<op>.
        ort_version: The onnxruntime the image pins: part of the cache key, so results built with
            another onnxruntime are not reused.
        int8_recipe: Build an int8 variant with this recipe instead of the task's search (empty:
            search); other precisions ignore it.
        thresholds: Parity threshold overrides, {precision or "*": {name: value}}: a task that
            searches its recipes (decoders' int8 and int4) judges them by the gate the validate
            step applies.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_optimize_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    out = run_optimize_step(
        Path(exported.path),
        Path(variant.path),
        target=target,
        precision=precision,
        int8_recipe=int8_recipe,
        threshold_overrides=thresholds,
    )
    for key, value in out.metrics.items():
        metrics.log_metric(key, value)
    variant.metadata.update(out.metadata)
