"""The whole packaging flow in one process, without KFP: export, then per variant optimize,
validate and benchmark, then package what passed. `ortpack build` calls this; the Kubeflow
pipeline runs the same steps as separate components."""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult, ParityReport
from components.core.benchmark import benchmark_variant
from components.core.errors import InvalidSpecError
from components.core.export import export_model
from components.core.optimize import optimize_model
from components.core.package import package_bundle
from components.core.parity import validate_variant
from components.core.specs import BuildSpec, thresholds_for
from serving.bundle import Manifest

log = logging.getLogger("ortpack.build")


@dataclass(frozen=True, kw_only=True)
class VariantOutcome:
    built: OptimizeResult
    parity: ParityReport
    benchmark: BenchmarkResult | None


@dataclass(frozen=True, kw_only=True)
class BuildResult:
    manifest: Manifest
    export: ExportResult
    outcomes: list[VariantOutcome]


def build_bundle(
    spec: BuildSpec,
    out_dir: Path,
    *,
    force: bool = False,
    work_dir: Path | None = None,
    keep_work: bool = False,
) -> BuildResult:
    """Build the bundle described by `spec` at `out_dir`.

    Steps run in `work_dir` (a temporary directory by default, removed afterwards unless
    `keep_work`). Raises `NoVariantPassedError` when every variant misses its gate; `out_dir` is
    then left untouched.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise InvalidSpecError(f"output directory exists: {out_dir} (use --force to replace it)")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="ortpack-build-"))
    try:
        log.info("step 1/%d: export %s (%s)", 2 + len(spec.variants), spec.export.source, spec.export.task)
        export = export_model(spec.export, work / "export")
        outcomes, variant_dirs = [], []
        for i, variant in enumerate(spec.variants, start=2):
            log.info("step %d/%d: variant %s", i, 2 + len(spec.variants), variant.id)
            vdir = work / "variants" / variant.id
            built = optimize_model(work / "export", variant, vdir)
            thresholds = thresholds_for(spec.export.task, variant.precision, spec.threshold_overrides)
            parity = validate_variant(vdir, work / "export", thresholds)
            bench = benchmark_variant(vdir, work / "export") if parity.passed else None
            outcomes.append(VariantOutcome(built=built, parity=parity, benchmark=bench))
            variant_dirs.append(vdir)
        step = 2 + len(spec.variants)
        log.info("step %d/%d: package %s", step, step, out_dir)
        manifest = package_bundle(work / "export", variant_dirs, out_dir, version=spec.version, force=force)
        return BuildResult(manifest=manifest, export=export, outcomes=outcomes)
    finally:
        if not keep_work and work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
