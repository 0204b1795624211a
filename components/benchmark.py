"""KFP component: latency of one variant against PyTorch eager."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from ortpack.components.container_images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def benchmark_variant(
    exported: Input[Model],
    variant: Input[Model],
    report: Input[Dataset],
    measured: Output[Model],
    metrics: Output[Metrics],
    ort_version: str,
) -> None:
    """Measure one variant the way the server loads it (never fails: it measures).

    A variant that missed its gate is not measured. Either way the output holds the variant's
    graph with all its records (optimize.json, parity.json, benchmark.json) for the package step.

    Args:
        exported: The export step's directory (PyTorch latency for the speed-up).
        variant: The optimize step's directory.
        report: The validate step's parity report.
        measured: Directory with model.onnx, optimize.json, parity.json and benchmark.json.
        metrics: bench.p50_ms.<shape>, bench.p95_ms.<shape>, bench.p99_ms.<shape>,
            bench.items_per_s.<shape>, bench.speedup_vs_torch.<shape>.
        ort_version: The onnxruntime the image pins: part of the cache key, so results built with
            another onnxruntime are not reused.
    """
    from pathlib import Path

    from ortpack.components.core.build import run_benchmark_step
    from ortpack.components.core.logs import log_to_stdout

    log_to_stdout()
    out = run_benchmark_step(Path(exported.path), Path(variant.path), Path(report.path), Path(measured.path))
    for key, value in out.metrics.items():
        metrics.log_metric(key, value)
    measured.metadata.update(out.metadata)
