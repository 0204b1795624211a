"""KFP component: the parity gate of one variant against PyTorch."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def validate_variant(
    exported: Input[Model],
    variant: Input[Model],
    thresholds: dict,
    report: Output[Dataset],
    metrics: Output[Metrics],
    ort_version: str,
    fail_on_miss: bool = False,
    allow_off_target_validation: bool = False,
) -> bool:
    """Compare one variant with the PyTorch reference outputs and apply its parity gate.

    Every number is logged before the verdict. In the pipeline the verdict is returned, so one
    variant's miss does not stop the others (the gate step fails the run when none passed);
    with fail_on_miss the step itself fails on a miss.

    Args:
        exported: The export step's directory (reference outputs).
        variant: The optimize step's directory.
        thresholds: Overrides of the default gates, {precision or "*": {name: value}}.
        report: Directory with parity.json (every number, the thresholds, the misses).
        metrics: parity.max_abs_diff, parity.mean_abs_diff, parity.min_cosine,
            parity.mean_cosine, parity.neighbour_agreement, parity.passed, ...
        fail_on_miss: Fail this step when the variant misses its gate.
        allow_off_target_validation: Pass a variant checked on another execution provider than
            its target's (a cuda variant on the CPU provider); the report marks it.
        ort_version: The onnxruntime the image pins: part of the cache key, so results built with
            another onnxruntime are not reused.

    Returns:
        Whether the variant passed its gate.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_validate_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    out = run_validate_step(
        Path(exported.path),
        Path(variant.path),
        Path(report.path),
        threshold_overrides=thresholds,
        allow_off_target=allow_off_target_validation,
        fail_on_miss=fail_on_miss,
    )
    for key, value in out.metrics.items():
        metrics.log_metric(key, value)
    report.metadata.update(out.metadata)
    return out.passed
