"""KFP component: latency of one variant against PyTorch eager."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE)
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

    from components.core.artifacts import BenchmarkResult, ParityReport, gather_variant
    from components.core.benchmark import benchmark_variant as run_benchmark
    from components.core.logs import log_to_stdout

    log_to_stdout()
    out = gather_variant(Path(variant.path), Path(report.path), Path(measured.path))
    parity = ParityReport.load(out)
    if not parity.passed:
        BenchmarkResult(
            variant_id=parity.variant_id,
            execution_providers=[],
            shapes={},
            speedup_vs_torch={},
            skipped="missed its parity gate",
        ).save(out)
        print(f"benchmark {parity.variant_id}: skipped (missed its parity gate)")
        return
    result = run_benchmark(out, Path(exported.path))
    for key, value in result.metrics().items():
        metrics.log_metric(key, value)
    measured.metadata.update({"variant_id": result.variant_id, "passed": True})
