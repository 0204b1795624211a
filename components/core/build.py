"""The packaging flow, in one process or as pipeline steps.

`build_bundle` runs export, then per variant optimize, validate and benchmark, then package, in
one process (`ortpack build`). The Kubeflow pipeline runs the same steps as separate components:
each component converts its artifacts to paths and calls one `run_*_step` function here, which
returns the step's KFP metrics and artifact metadata (`StepOutput`).

The mapping between user options and specs lives here once: `export_parameters` turns the
model options into the pipeline's parameters, and `export_spec_from_parameters` turns those
parameters into an `ExportSpec`; the CLI (`run`, `submit`) and the export component both use it.
Only light modules are imported at module level (the CLI validates options with this module
before any heavy work).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortpack.components.core.artifacts import (
    BenchmarkResult,
    ExportResult,
    OptimizeResult,
    ParityReport,
    VariantRecord,
    gather_variant,
)
from ortpack.components.core.benchmark import benchmark_variant
from ortpack.components.core.compat import check_baseline
from ortpack.components.core.errors import InvalidSpecError, NoVariantPassedError, SourceUnreachableError, one_line
from ortpack.components.core.export import export_model
from ortpack.components.core.optimize import optimize_model
from ortpack.components.core.package import Verdict, package_bundle, publish_bundle, sign_written_bundle
from ortpack.components.core.parity import validate_variant
from ortpack.components.core.report import write_report
from ortpack.components.core.sources import (
    default_name,
    fetch_source,
    is_remote,
    load_credentials,
    parse_source_versions,
    tree_digest,
)
from ortpack.components.core.specs import BuildSpec, ExportSpec, VariantSpec
from ortpack.components.core.specs import task_options as task_options_of
from ortpack.components.core.tasks import check_build_spec, resolve_model_source, thresholds_for
from ortpack.kernel.bundle import MANIFEST_NAME, sha256_file
from ortpack.kernel.contracts import get_contract, space_tasks

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import (
        BenchmarkResult,
        ExportResult,
        OptimizeResult,
        ParityReport,
        VariantRecord,
    )
    from ortpack.components.core.compat import BaselineCheck
    from ortpack.kernel.bundle import Manifest

log = logging.getLogger("ortpack.build")

# A download that cannot reach its store is tried this many times, waiting FETCH_BACKOFF_S between
# tries (the export step itself is not retried by the pipeline: a refusal must end the run at once)
FETCH_ATTEMPTS, FETCH_BACKOFF_S = 3, (5.0, 20.0)

# ---------------------------------------------------------------------------- options <-> specs


def export_parameters(
    *,
    task: str,
    name: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    allow_degenerate_reference: bool = False,
) -> dict[str, Any]:
    """The export step's pipeline parameters for these model options (KFP parameters have no
    None: "" means "not given"); the task's options are checked against its contract and travel
    as one dict of the options given (`task_options`)."""
    options = task_options_of(task, {k: v for k, v in (task_options or {}).items() if v is not None})
    return {
        "task": task,
        "name": name or "",
        "task_options": options.given(),
        "allow_degenerate_reference": bool(allow_degenerate_reference),
    }


def pipeline_parameters(spec: BuildSpec) -> dict[str, Any]:
    """The pipeline's parameters that carry a checked BuildSpec (the CLI builds and checks one
    spec, then passes it as these): the export's (`export_parameters`), the gate overrides, the
    int8 recipe, the version and each target's precisions. `export_spec_from_parameters` reads
    the export back unchanged."""
    export = spec.export
    targets = dict.fromkeys(v.target for v in spec.variants)
    return {
        **export_parameters(
            task=export.task,
            name=export.name,
            task_options=task_options_of(export.task, export.options).given(),
            allow_degenerate_reference=export.allow_degenerate_reference,
        ),
        "thresholds": {precision: dict(values) for precision, values in spec.threshold_overrides.items()},
        "int8_recipe": spec.int8_recipe or "",
        "version": spec.version,
        "allow_off_target_validation": spec.allow_off_target_validation,
        **{f"{t}_precisions": [v.precision for v in spec.variants if v.target == t] for t in targets},
    }


def export_spec_from_parameters(params: Mapping[str, Any], *, source: str, default_name: str) -> ExportSpec:
    """The ExportSpec of the export step's parameters (`export_parameters`); validated (the task
    and its options against its contract), so a bad value fails here, before any heavy work."""
    return ExportSpec(
        source=source,
        task=str(params["task"]),
        name=str(params.get("name") or default_name),
        options=dict(params.get("task_options") or {}),
        allow_degenerate_reference=bool(params.get("allow_degenerate_reference", False)),
    )


def resolve_version(version: str, run_id: str) -> str:
    """The bundle version: `version` when given, else unique per run: the UTC time and a short
    hash of the run id (`20261130.101500-1a2b3c4d`; also a valid OCI tag)."""
    if version:
        return version
    stamp = time.strftime("%Y%m%d.%H%M%S", time.gmtime())
    return f"{stamp}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


# ---------------------------------------------------------------------------- one process


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

    check_build_spec(spec)  # what the spec cannot check alone (the task's options, recipe, gates)
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
            gate = thresholds_for(spec.export.task, variant.precision, spec.threshold_overrides)
            built = optimize_model(export_dir, variant, vdir, int8_recipe=spec.int8_recipe, thresholds=gate)
            parity = validate_variant(
                vdir,
                export_dir,
                gate,
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


# ---------------------------------------------------------------------------- pipeline steps


@dataclass(frozen=True, kw_only=True)
class StepOutput:
    """What a pipeline step reports to KFP: metrics (flat names) and its output's metadata."""

    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    passed: bool = True


def kfp_metrics(result: ExportResult | OptimizeResult | ParityReport | BenchmarkResult) -> dict[str, float]:
    """The stable KFP metric names of a step's result (README, "Metrics")."""

    if isinstance(result, ExportResult):
        out = {f"export.{k}": float(v) for k, v in result.metrics.items()}
        out.update({f"torch.p50_ms.{shape}": float(s["p50_ms"]) for shape, s in result.torch_latency.items()})
        return out
    if isinstance(result, OptimizeResult):
        out = {f"optimize.{k}": float(result.metrics[k]) for k in ("nodes_before", "nodes_after", "mb", "seconds")}
        out.update({f"optimize.fusions.{op}": float(n) for op, n in result.metrics.get("fusions", {}).items()})
        return out
    return result.metrics()


def fetch_with_retries(uri: str, dest: Path, **options: Any) -> Any:
    """`sources.fetch_source`, tried again when the store cannot be reached (a transient fault:
    `SourceUnreachableError`); anything else (a bad URI, a refused file) fails at once."""

    for attempt in range(1, FETCH_ATTEMPTS + 1):
        try:
            return fetch_source(uri, dest, **options)
        except SourceUnreachableError as exc:
            if attempt == FETCH_ATTEMPTS:
                raise
            wait = FETCH_BACKOFF_S[min(attempt, len(FETCH_BACKOFF_S)) - 1]
            log.warning("export: %s (try %d of %d; again in %.0f s)", exc, attempt, FETCH_ATTEMPTS, wait)
            shutil.rmtree(dest, ignore_errors=True)
            time.sleep(wait)
    raise AssertionError("unreachable")


def run_export_step(
    out_dir: Path, *, model_uri: str, source_versions: str = "", params: Mapping[str, Any]
) -> StepOutput:
    """The export step: fetch what `model_uri` (and a `weights`/`labels` URI) names, export it, and
    record where it came from and its content digest in the export's source (the manifest's
    `source`: `id` the URI, `revision` the commit (hf://) or the content's sha256 tree digest).

    `source_versions` is what the resolve step saw (`sources.resolve_source_versions`): hf://
    downloads exactly that commit, and a source that changed since fails."""

    loaded = load_credentials()
    if loaded:
        log.info("export: credentials from the mounted secret: %s", ", ".join(loaded))
    params = dict(params)
    pins = parse_source_versions(source_versions)
    fetch_root = Path(tempfile.mkdtemp(prefix="ortpack-fetch-"))
    try:
        fetched = None
        model = model_uri
        if is_remote(model_uri):
            log.info("export: fetching %s", model_uri)
            fetched = fetch_with_retries(model_uri, fetch_root / "model", pinned=pins.get("model", ""))
            model = str(fetched.path)
        options = dict(params.get("task_options") or {})
        for key in get_contract(str(params["task"])).options.FILES:  # weights, labels: a URI is fetched
            if is_remote(options.get(key)):
                log.info("export: fetching %s", options[key])
                fetched_file = fetch_with_retries(options[key], fetch_root / key, kind=key, pinned=pins.get(key, ""))
                options[key] = str(fetched_file.path)
        params["task_options"] = options
        source, name = resolve_model_source(model, str(params["task"]))
        if fetched is not None:
            name = default_name(model_uri)
        spec = export_spec_from_parameters(params, source=source, default_name=name)

        def where_from(record: dict[str, Any]) -> dict[str, Any]:
            """The URI fetched and its revision (an hf:// commit, else the content digest), or a
            local checkpoint's tree digest when the exporter records no revision."""
            if fetched is not None:
                record.update(id=model_uri, revision=fetched.revision or fetched.digest)
            elif record.get("revision") is None and Path(source).exists():
                record["revision"] = tree_digest(Path(source))
            return record

        result = export_model(spec, Path(out_dir), source=where_from)
        record = result.source
    finally:
        shutil.rmtree(fetch_root, ignore_errors=True)
    return StepOutput(
        metrics=kfp_metrics(result),
        metadata={"task": result.task, "name": result.name, "opset": result.opset, "source": record},
    )


def run_optimize_step(
    export_dir: Path,
    out_dir: Path,
    *,
    target: str,
    precision: str,
    int8_recipe: str = "",
    threshold_overrides: Mapping[str, Mapping[str, float]] | None = None,
) -> StepOutput:
    """The optimize step: one variant (target x precision) from the export; `int8_recipe` pins
    an int8 variant's recipe (empty: the task chooses); a search judges its candidates by the
    precision's gate with `threshold_overrides` applied, as the validate step will."""

    variant = VariantSpec(target=target, precision=precision)
    log.info("optimize %s: building the variant", variant.id)
    task = ExportResult.load(Path(export_dir)).task
    gate = thresholds_for(task, precision, {k: dict(v) for k, v in (threshold_overrides or {}).items()})
    result = optimize_model(Path(export_dir), variant, Path(out_dir), int8_recipe=int8_recipe or None, thresholds=gate)
    return StepOutput(
        metrics=kfp_metrics(result),
        metadata={
            "variant_id": result.variant_id,
            "execution_providers": result.execution_providers,
            "ort_version": result.ort_version,
            "offline_optimization_level": result.offline_optimization_level,
        },
    )


def run_validate_step(
    export_dir: Path,
    variant_dir: Path,
    out_dir: Path,
    *,
    threshold_overrides: Mapping[str, Mapping[str, float]],
    allow_off_target: bool = False,
    fail_on_miss: bool = False,
) -> StepOutput:
    """The validate step: the variant's gate (the task's defaults for its precision, with the
    overrides applied) against the PyTorch reference; `passed` is the verdict."""

    built = OptimizeResult.load(Path(variant_dir))
    task = ExportResult.load(Path(export_dir)).task
    log.info("validate %s: the parity gate against the PyTorch reference", built.variant_id)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    overrides = {k: dict(v) for k, v in threshold_overrides.items()}
    parity = validate_variant(
        Path(variant_dir),
        Path(export_dir),
        thresholds_for(task, built.precision, overrides),
        out_dir=Path(out_dir),
        allow_off_target=allow_off_target,
    )
    log.info("parity %s", parity.summary())
    if fail_on_miss:
        parity.raise_if_failed()
    return StepOutput(
        metrics=kfp_metrics(parity),
        metadata={"variant_id": parity.variant_id, "passed": parity.passed, "misses": parity.misses},
        passed=parity.passed,
    )


def run_benchmark_step(export_dir: Path, variant_dir: Path, report_dir: Path, out_dir: Path) -> StepOutput:
    """The benchmark step: gather the variant's graph and records into `out_dir`, then measure it
    (a variant that missed its gate is recorded as skipped, not measured)."""

    out = gather_variant(Path(variant_dir), Path(report_dir), Path(out_dir))
    parity = ParityReport.load(out)
    log.info("benchmark %s: measuring latency", parity.variant_id)
    if not parity.passed:
        reason = "missed its parity gate"
        BenchmarkResult(
            variant_id=parity.variant_id, execution_providers=[], shapes={}, speedup_vs_torch={}, skipped=reason
        ).save(out)
        log.info("benchmark %s: skipped (%s)", parity.variant_id, reason)
        return StepOutput(metadata={"variant_id": parity.variant_id, "passed": False}, passed=False)
    result = benchmark_variant(out, Path(export_dir))
    return StepOutput(metrics=kfp_metrics(result), metadata={"variant_id": result.variant_id, "passed": True})


def run_package_step(
    export_dir: Path,
    variant_dirs: list[Path],
    *,
    bundle_dir: Path,
    report_html: Path,
    summary_md: Path,
    verdict_dir: Path,
    version: str,
    run_id: str,
    sign_key: str = "",
    baseline_bundle: str = "",
    require_compatible: bool = False,
    compatibility_budget: float = 0.95,  # compat.DEFAULT_BUDGET (not imported here: numpy)
) -> StepOutput:
    """The package step: the report and summary, then the bundle of every variant that passed
    (signed when `sign_key` names a private key), then the verdict (`package.Verdict`).

    With a `baseline_bundle` (text-embedding only), the bundle is first written to a scratch
    directory and compared with the baseline (`compat.check_baseline`, what `ortpack bundle diff`
    does), so that report.html inside the bundle carries the verdict; with `require_compatible`, a
    verdict other than drop-in ships nothing, like a build where no variant passed.

    It does not fail when nothing ships (a failed step's outputs are lost on the backend): the
    verdict says so, and the gate step fails the run from it. A baseline that cannot be compared
    fails the step (`InvalidSpecError`, one line)."""

    export_dir = Path(export_dir)
    export = ExportResult.load(export_dir)

    if baseline_bundle and get_contract(export.task).space is None:  # refused before any other work
        raise InvalidSpecError(
            f"a baseline bundle is compared as `ortpack bundle diff` does, for embedding bundles only "
            f"({', '.join(space_tasks())}); this run packages a {export.task} model"
        )
    if require_compatible and not baseline_bundle:
        raise InvalidSpecError("require_compatible needs a baseline_bundle to compare with")
    records = sorted((VariantRecord.load(Path(d)) for d in variant_dirs), key=lambda r: r.variant_id)
    metrics = {"variants.built": float(len(records)), "variants.passed": float(sum(r.passed for r in records))}
    for rec in records:
        for key, value in rec.parity.metrics().items():
            metrics[f"{rec.variant_id}.{key}"] = value
        for key, value in (rec.benchmark.metrics() if rec.benchmark else {}).items():
            metrics[f"{rec.variant_id}.{key}"] = value
    version = resolve_version(version, run_id)
    misses = {r.variant_id: list(r.parity.misses) for r in records}
    check = None
    if baseline_bundle and any(r.passed for r in records):
        check = _compare_with_baseline(
            export_dir, records, version, baseline_bundle, budget=compatibility_budget, required=require_compatible
        )
        metrics.update(check.metrics())
    write_report(export_dir, records, Path(report_html), Path(summary_md), compatibility=check)
    compatibility = check.as_dict() if check else None
    if check is not None and check.blocks:
        verdict = Verdict(
            passed=False,
            name=export.name,
            version=version,
            variants=misses,
            reason=check.summary(),
            compatibility=compatibility,
        )
        verdict.save(Path(verdict_dir))
        log.error("package: %s", verdict.reason)
        return StepOutput(metrics=metrics, metadata={"passed": False, "version": version}, passed=False)
    try:
        manifest = package_bundle(export_dir, records, Path(bundle_dir), version=version, report_html=Path(report_html))
    except NoVariantPassedError as exc:
        verdict = Verdict(passed=False, name=export.name, version=version, variants=misses, reason=one_line(exc))
        verdict.save(Path(verdict_dir))
        log.error("package: %s", verdict.reason)
        return StepOutput(metrics=metrics, metadata={"passed": False, "version": version}, passed=False)
    if sign_key:
        sign_written_bundle(Path(bundle_dir), Path(sign_key))
    metrics["bundle.mb"] = sum(f.bytes for f in manifest.files.values()) / 1e6
    verdict = Verdict(
        passed=True,
        name=manifest.name,
        version=manifest.version,
        variants=misses,
        manifest_sha256=sha256_file(Path(bundle_dir) / MANIFEST_NAME),
        signed=bool(sign_key),
        compatibility=compatibility,
    )
    verdict.save(Path(verdict_dir))
    metadata = {
        "name": manifest.name,
        "version": manifest.version,
        "variants": [v.id for v in manifest.variants],
        "manifest_sha256": verdict.manifest_sha256,
        "signed": verdict.signed,
    }
    if check is not None:
        metadata["compatibility"] = check.diff.verdict
    return StepOutput(metrics=metrics, metadata=metadata)


def _compare_with_baseline(
    export_dir: Path, records: list[VariantRecord], version: str, baseline: str, *, budget: float, required: bool
) -> BaselineCheck:
    """Write the bundle to a scratch directory (without its report, which is to hold the verdict)
    and compare it with the baseline; credentials come from the mounted secret, as for the model."""

    loaded = load_credentials()
    if loaded:
        log.info("package: credentials from the mounted secret: %s", ", ".join(loaded))
    log.info("package: comparing the bundle with the baseline %s", baseline)
    scratch = Path(tempfile.mkdtemp(prefix="ortpack-compat-"))
    try:
        package_bundle(export_dir, records, scratch / "bundle", version=version)
        check = check_baseline(baseline, scratch / "bundle", budget=budget, required=required)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if check.drop_in:
        log.info("package: %s (compared in %.1f s)", check.summary(), check.diff.seconds)
    elif not check.blocks:  # a blocking verdict is logged as the step's error
        log.warning("package: %s (compared in %.1f s)", check.summary(), check.diff.seconds)
    return check


def run_gate_step(verdict_dir: Path) -> str:
    """The gate step: fail (NoVariantPassedError, the one-line reason) when no variant passed;
    else return the bundle's version."""

    verdict = Verdict.load(Path(verdict_dir))
    verdict.raise_if_failed()
    log.info(
        "gate: %s %s passed (%s)",
        verdict.name,
        verdict.version,
        ", ".join(k for k, v in verdict.variants.items() if not v),
    )
    return verdict.version


def run_publish_step(bundle_dir: Path, destination: str) -> str:
    """The publish step: push the bundle to an OCI registry or upload it as a tar to S3; return the
    pinned URI (credentials from the mounted secret, `sources.load_credentials`)."""

    load_credentials()
    pinned = publish_bundle(Path(bundle_dir), destination)
    log.info("publish: %s", pinned)
    return pinned
