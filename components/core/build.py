"""The whole packaging flow in one process, without KFP: export, then per variant optimize,
validate and benchmark, then package what passed. `ortpack build` calls this; the Kubeflow
pipeline runs the same steps as separate components."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.core.artifacts import ExportResult, VariantRecord
from components.core.benchmark import benchmark_variant
from components.core.errors import InvalidSpecError
from components.core.export import export_model
from components.core.optimize import optimize_model
from components.core.package import package_bundle
from components.core.parity import validate_variant
from components.core.report import write_report
from components.core.specs import BuildSpec, thresholds_for
from serving.bundle import Manifest

log = logging.getLogger("ortpack.build")


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    manifest: Manifest
    export: ExportResult
    records: list[VariantRecord]


def build_bundle(spec: BuildSpec, out_dir: Path, *, force: bool = False, work_dir: Path | None = None) -> BuildResult:
    """Build the bundle described by `spec` at `out_dir`, with report.html inside.

    Steps run in `work_dir` (a temporary directory by default, removed afterwards). Raises
    `NoVariantPassedError` when every variant misses its gate; `out_dir` is then left untouched
    (the report of the failed build stays in `work_dir` when one was given).
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise InvalidSpecError(f"output directory exists: {out_dir} (use --force to replace it)")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="ortpack-build-"))
    steps = 2 + len(spec.variants)
    try:
        log.info("step 1/%d: export %s (%s)", steps, spec.export.source, spec.export.task)
        export_dir = work / "export"
        export = export_model(spec.export, export_dir)
        records = []
        for i, variant in enumerate(spec.variants, start=2):
            log.info("step %d/%d: variant %s", i, steps, variant.id)
            vdir = work / "variants" / variant.id
            built = optimize_model(export_dir, variant, vdir)
            parity = validate_variant(
                vdir,
                export_dir,
                thresholds_for(spec.export.task, variant.precision, spec.threshold_overrides),
                allow_off_target=spec.allow_off_target_validation,
            )
            bench = benchmark_variant(vdir, export_dir) if parity.passed else None
            records.append(VariantRecord(model_dir=vdir, built=built, parity=parity, benchmark=bench))
        log.info("step %d/%d: package %s", steps, steps, out_dir)
        report = work / "report.html"
        write_report(export_dir, records, report)
        manifest = package_bundle(export_dir, records, out_dir, version=spec.version, force=force, report_html=report)
        return BuildResult(manifest=manifest, export=export, records=records)
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
