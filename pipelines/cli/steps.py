"""The step commands, each one step of the pipeline in this process (no KFP): `export`,
`optimize`, `validate`, `benchmark`, `package`, and `build` (all of them in one go), with their flags."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from ortpack.components.core.artifacts import ExportResult, OptimizeResult, VariantRecord
from ortpack.components.core.benchmark import benchmark_variant
from ortpack.components.core.build import build_bundle, resolve_version
from ortpack.components.core.errors import InvalidSpecError
from ortpack.components.core.export import export_model
from ortpack.components.core.optimize import optimize_model
from ortpack.components.core.package import package_bundle
from ortpack.components.core.parity import validate_variant
from ortpack.components.core.report import format_summary, write_report
from ortpack.components.core.specs import BuildSpec, VariantSpec, parse_threshold_overrides, variant_grid
from ortpack.components.core.tasks import thresholds_for
from ortpack.pipelines.cli.common import existing_dir, fresh_dir
from ortpack.pipelines.cli.options import (
    add_command,
    add_int8_recipe,
    add_model,
    add_off_target,
    add_thresholds,
    add_variants,
    add_version,
    csv_list,
    export_spec,
    threshold_overrides,
)


def add_commands(sub: Any) -> None:
    """`build`, `export`, `optimize`, `validate`, `benchmark` and `package`, in this order in `ortpack --help`."""
    p = add_command(
        sub, "build", cmd_build, "export, optimize, validate, benchmark and package in one process (no KFP)"
    )
    add_model(p)
    add_variants(p)
    p.add_argument("--out", required=True, help="bundle directory to create, e.g. dist/all-MiniLM-L6-v2")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--work-dir", help="keep intermediate step outputs here (default: a temporary directory)")

    p = add_command(sub, "export", cmd_export, "export a model to ONNX with the PyTorch reference outputs")
    add_model(p)
    p.add_argument("--out", required=True, help="directory to write (model.onnx, reference.npz, export.json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    p = add_command(sub, "optimize", cmd_optimize, "build one variant (target x precision) from an export")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--target", required=True, help="target preset: cpu or cuda")
    p.add_argument(
        "--precision", required=True, help="fp32, int8 or int4 (cpu; int4: text-generation), fp16 or fp32 (cuda)"
    )
    p.add_argument("--out", required=True, help="directory to write (model.onnx, optimize.json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_int8_recipe(p)

    p = add_command(sub, "validate", cmd_validate, "run the parity gate on one variant (exit 1 when it misses)")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, help="directory written by `ortpack optimize`")
    add_thresholds(p)
    add_off_target(p)

    p = add_command(sub, "benchmark", cmd_benchmark, "measure one variant's latency against PyTorch")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, help="directory written by `ortpack optimize`")

    p = add_command(sub, "package", cmd_package, "write a bundle from validated variants")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, action="append", help="a validated variant directory; repeatable")
    p.add_argument("--out", required=True, help="bundle directory to create")
    add_version(p)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def cmd_build(args: argparse.Namespace) -> int:

    spec = BuildSpec(
        export=export_spec(args),
        variants=tuple(variant_grid(csv_list(args.targets), csv_list(args.precisions))),
        threshold_overrides=threshold_overrides(args),
        version=resolve_version(args.version or "", uuid.uuid4().hex),
        allow_off_target_validation=args.allow_off_target_validation,
        int8_recipe=args.int8_recipe or None,
    )
    result = build_bundle(  # checks the spec before any heavy work
        spec, Path(args.out), force=args.force, work_dir=Path(args.work_dir) if args.work_dir else None
    )
    print(format_summary(result.export, result.records))
    print(f"bundle: {args.out} ({', '.join(v.id for v in result.manifest.variants)}), version {spec.version}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:

    spec = export_spec(args)
    out = fresh_dir(Path(args.out), args.force)
    export_model(spec, out)
    print(out)
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:

    variant = VariantSpec(target=args.target, precision=args.precision)
    export_dir = existing_dir(args.export, "export")
    if args.int8_recipe and variant.precision != "int8":
        raise InvalidSpecError("--int8-recipe applies only to --precision int8")
    out = fresh_dir(Path(args.out), args.force)
    optimize_model(export_dir, variant, out, int8_recipe=args.int8_recipe or None)
    print(out)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:

    export_dir = existing_dir(args.export, "export")
    variant_dir = existing_dir(args.variant, "variant")
    export, built = ExportResult.load(export_dir), OptimizeResult.load(variant_dir)
    thresholds = thresholds_for(export.task, built.precision, parse_threshold_overrides(args.threshold))
    report = validate_variant(variant_dir, export_dir, thresholds, allow_off_target=args.allow_off_target_validation)
    for name, value in sorted(report.values.items()):
        print(f"{name:32s} {value:.6g}")
    report.raise_if_failed()
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:

    result = benchmark_variant(existing_dir(args.variant, "variant"), existing_dir(args.export, "export"))
    for name, value in sorted(result.metrics().items()):
        print(f"{name:32s} {value:.4g}")
    return 0


def cmd_package(args: argparse.Namespace) -> int:
    """Like the pipeline's package step: report.html (inside the bundle), then the bundle."""
    import tempfile

    export_dir = existing_dir(args.export, "export")
    variant_dirs = [existing_dir(v, "variant") for v in args.variant]
    records = sorted((VariantRecord.load(d) for d in variant_dirs), key=lambda r: r.variant_id)
    with tempfile.TemporaryDirectory(prefix="ortpack-package-") as tmp:
        report = Path(tmp) / "report.html"
        write_report(export_dir, records, report)
        manifest = package_bundle(
            export_dir,
            records,
            Path(args.out),
            version=resolve_version(args.version or "", uuid.uuid4().hex),
            force=args.force,
            report_html=report,
        )
    print(
        f"bundle: {args.out} ({', '.join(v.id for v in manifest.variants)}), report: {Path(args.out) / 'report.html'}"
    )
    return 0
