"""Step 5: package every variant that passed its gate into a bundle (see `serving.bundle`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult, ParityReport
from components.core.errors import NoVariantPassedError
from serving.bundle import Manifest, write_bundle

log = logging.getLogger("ortpack.package")


def _variant_record(built: OptimizeResult, parity: ParityReport, bench: BenchmarkResult | None) -> dict[str, Any]:
    return {
        "id": built.variant_id,
        "target": built.target,
        "precision": built.precision,
        "execution_providers": built.execution_providers,
        "file": f"variants/{built.variant_id}/model.onnx",
        "ort_version": built.ort_version,
        "opset": built.opset,
        "offline_optimization_level": built.offline_optimization_level,
        "optimize": built.metrics,
        "parity": {
            "passed": parity.passed,
            "validated_on": parity.validated_on,
            "samples": parity.samples,
            "thresholds": parity.thresholds,
            "values": parity.values,
        },
        "benchmark": {"shapes": bench.shapes, "speedup_vs_torch": bench.speedup_vs_torch} if bench else {},
    }


def package_bundle(
    export_dir: Path,
    variant_dirs: list[Path],
    out_dir: Path,
    *,
    version: str = "1",
    force: bool = False,
    report_html: Path | None = None,
) -> Manifest:
    """Write the bundle for every variant in `variant_dirs` whose `parity.json` passed.

    Raises `NoVariantPassedError`, listing every variant's misses, when none passed; the bundle
    is written atomically, so a failure leaves nothing at `out_dir`.
    """
    import onnxruntime

    export_dir = Path(export_dir)
    export = ExportResult.load(export_dir)
    variants, files, missed = [], {}, []
    for vdir in map(Path, variant_dirs):
        built = OptimizeResult.load(vdir)
        parity = ParityReport.load(vdir)
        if not parity.passed:
            missed.append(parity.summary())
            log.warning("package: dropping %s", parity.summary())
            continue
        bench = BenchmarkResult.load(vdir) if (vdir / BenchmarkResult.FILE).is_file() else None
        record = _variant_record(built, parity, bench)
        variants.append(record)
        files[record["file"]] = vdir / built.model_file
    if not variants:
        raise NoVariantPassedError("no variant passed its parity gate: " + " | ".join(missed))
    for name in export.extra_files:
        files[name] = export_dir / name
    if report_html is not None:
        files["report.html"] = Path(report_html)
    manifest: dict[str, Any] = export.manifest_fields()
    manifest.update(
        version=version,
        variants=variants,
        versions={**export.versions, "onnxruntime": onnxruntime.__version__, "ortpack": _ortpack_version()},
    )
    written = write_bundle(Path(out_dir), manifest, files, force=force)
    log.info("package: wrote %s with variants %s", out_dir, ", ".join(v.id for v in written.variants))
    return written


def _ortpack_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ortpack")
    except PackageNotFoundError:
        return "0+unknown"
