"""Step 5: package every variant that passed its gate into a bundle (see `serving.bundle`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult, ParityReport, VariantRecord
from components.core.errors import NoVariantPassedError
from serving.bundle import Manifest, write_bundle

log = logging.getLogger("ortpack.package")


def variant_record(built: OptimizeResult, parity: ParityReport, bench: BenchmarkResult | None) -> dict[str, Any]:
    return {
        "id": built.variant_id,
        "target": built.target,
        "precision": built.precision,
        "execution_providers": built.execution_providers,
        "file": f"variants/{built.variant_id}/model.onnx",
        "ort_version": built.ort_version,
        "opset": built.opset,
        "offline_optimization_level": built.offline_optimization_level,
        "online_optimization_level": built.online_optimization_level,
        "optimize": built.metrics,
        "parity": {
            "passed": parity.passed,
            "validated_on": parity.validated_on,
            "samples": parity.samples,
            "thresholds": parity.thresholds,
            "values": parity.values,
            "hardware": parity.hardware or None,
            "probe": parity.probe or None,
            "off_target": parity.off_target,
        },
        "benchmark": {
            "shapes": bench.shapes,
            "speedup_vs_torch": bench.speedup_vs_torch,
            "execution_providers": bench.execution_providers,
            "hardware": bench.hardware or None,
            "threads": bench.threads,
        }
        if bench
        else {},
    }


def package_bundle(
    export_dir: Path,
    records: list[VariantRecord],
    out_dir: Path,
    *,
    version: str = "1",
    force: bool = False,
    report_html: Path | None = None,
) -> Manifest:
    """Write the bundle for every variant in `records` that passed its gate.

    Raises `NoVariantPassedError`, listing every variant's misses, when none passed; the bundle
    is written atomically, so a failure leaves nothing at `out_dir`.
    """
    import onnxruntime

    export_dir = Path(export_dir)
    export = ExportResult.load(export_dir)
    variants, files = [], {}
    for rec in records:
        if not rec.passed:
            log.warning("package: dropping %s", rec.parity.summary())
            continue
        entry = variant_record(rec.built, rec.parity, rec.benchmark)
        variants.append(entry)
        files[entry["file"]] = rec.model_dir / rec.built.model_file
    if not variants:
        raise NoVariantPassedError(
            "no variant passed its parity gate: " + " | ".join(r.parity.summary() for r in records)
        )
    for name in export.extra_files:
        files[name] = export_dir / name
    if report_html is not None:
        files["report.html"] = Path(report_html)
    manifest: dict[str, Any] = export.manifest_fields()
    probe_file = next((f for f in export.extra_files if f.startswith("probe/")), None)
    if probe_file is not None:
        from serving.probe import Probe

        samples = len(Probe.from_bytes((export_dir / probe_file).read_bytes()).inputs)
        manifest["probe"] = {"file": probe_file, "samples": samples}
    manifest.update(
        version=version,
        variants=variants,
        versions={**export.versions, "onnxruntime": onnxruntime.__version__, "ortpack": _ortpack_version()},
    )
    written = write_bundle(Path(out_dir), manifest, files, force=force)
    log.info("package: wrote %s with variants %s", out_dir, ", ".join(v.id for v in written.variants))
    return written


def package_dirs(export_dir: Path, variant_dirs: list[Path], out_dir: Path, **kwargs: Any) -> Manifest:
    """`package_bundle` for directories that each hold a variant's graph and records."""
    records = sorted((VariantRecord.load(d) for d in variant_dirs), key=lambda r: r.variant_id)
    return package_bundle(export_dir, records, out_dir, **kwargs)


def _ortpack_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ortpack")
    except PackageNotFoundError:
        return "0+unknown"
