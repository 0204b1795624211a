"""KFP component: the bundle of every variant that passed, and the report."""

from kfp import dsl
from kfp.dsl import HTML, Input, Markdown, Metrics, Model, Output

from components.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE)
def package_bundle(
    exported: Input[Model],
    version: str,
    bundle: Output[Model],
    report: Output[HTML],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    cpu_variants: Input[list[Model]] = None,
    cuda_variants: Input[list[Model]] = None,
) -> None:
    """Write the bundle (model.onnx per passing variant, tokenizer, manifest.json, report.html).

    The report, summary and metrics are written first, so a run where no variant passed still
    shows why; then the step fails when no variant passed.

    Args:
        exported: The export step's directory.
        version: The bundle version written to the manifest.
        bundle: The bundle directory.
        report: report.html: latency, agreement and size plots, the numbers, the versions.
        summary: A Markdown table of every variant.
        metrics: variants.built, variants.passed, bundle.mb, and <variant>.<metric> per variant.
        cpu_variants: Every cpu branch's measured variant.
        cuda_variants: Every cuda branch's measured variant.
    """
    from pathlib import Path

    from components.core.artifacts import VariantRecord
    from components.core.logs import log_to_stdout
    from components.core.package import package_bundle as write_bundle
    from components.core.report import write_report

    log_to_stdout()
    dirs = [Path(v.path) for v in [*(cpu_variants or []), *(cuda_variants or [])]]
    records = sorted((VariantRecord.load(d) for d in dirs), key=lambda r: r.variant_id)
    write_report(Path(exported.path), records, Path(report.path), Path(summary.path))
    metrics.log_metric("variants.built", float(len(records)))
    metrics.log_metric("variants.passed", float(sum(r.passed for r in records)))
    for rec in records:
        for key, value in rec.parity.metrics().items():
            metrics.log_metric(f"{rec.variant_id}.{key}", value)
        for key, value in (rec.benchmark.metrics() if rec.benchmark else {}).items():
            metrics.log_metric(f"{rec.variant_id}.{key}", value)
    manifest = write_bundle(
        Path(exported.path), records, Path(bundle.path), version=version, report_html=Path(report.path)
    )
    metrics.log_metric("bundle.mb", sum(f.bytes for f in manifest.files.values()) / 1e6)
    bundle.metadata.update(
        {"name": manifest.name, "version": manifest.version, "variants": [v.id for v in manifest.variants]}
    )
