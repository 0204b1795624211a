"""The `ortpack` command line.

Every command validates its options before heavy work, prints progress to stderr, and on
failure prints one line `ortpack: error: ...` and exits non-zero:

    0  success
    1  the parity gate failed (nothing was shipped)
    2  bad input: options, paths, models, bundles
    3  this environment cannot do it (a missing provider, a full disk, ...)
   70  an internal error (a bug: run again with --debug for the traceback)
  130  interrupted
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_GATE, EXIT_INPUT, EXIT_ENV, EXIT_INTERNAL, EXIT_INTERRUPT = 1, 2, 3, 70, 130

log = logging.getLogger("ortpack")


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"[ortpack {time.monotonic() - self.start:6.1f}s]"
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"{prefix} {level}{record.getMessage()}"


def _setup_logging(verbosity: int, debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    # Third-party libraries (quantization, exporter) log and warn freely; keep stderr readable.
    logging.getLogger().setLevel(logging.DEBUG if debug else logging.ERROR)
    if not debug:
        warnings.filterwarnings("ignore")


def _floats3(value: str) -> tuple[float, float, float]:
    try:
        numbers = tuple(float(v) for v in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 3 comma-separated numbers, got {value!r}") from None
    if len(numbers) != 3:
        raise argparse.ArgumentTypeError(f"expected 3 comma-separated numbers, got {value!r}")
    return numbers  # type: ignore[return-value]


def export_spec(args: argparse.Namespace, source: str, default_name: str, local_files: bool = True) -> Any:
    """The ExportSpec of a command's model options (validated: bad values fail here, before work).
    With `local_files`, --weights and --labels must exist here; a submitted run reads them in the
    cluster's component image instead."""
    from components.core.sources import check_local_file
    from components.core.specs import ExportSpec

    return ExportSpec(
        source=source,
        task=args.task,
        name=args.name or default_name,
        max_length=args.max_length,
        weights=check_local_file(args.weights, "weights") if local_files else args.weights,
        labels=check_local_file(args.labels, "labels") if local_files else args.labels,
        resize_size=args.resize_size,
        crop_size=args.crop_size,
        mean=args.mean,
        std=args.std,
        allow_degenerate_reference=args.allow_degenerate_reference,
    )


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items


# ---------------------------------------------------------------------------- commands


def cmd_build(args: argparse.Namespace) -> int:
    from components.core.build import build_bundle
    from components.core.report import format_summary
    from components.core.sources import resolve_model_source
    from components.core.specs import BuildSpec, parse_threshold_overrides, variant_grid

    source, default_name = resolve_model_source(args.model, args.task)
    spec = BuildSpec(
        export=export_spec(args, source, default_name),
        variants=tuple(variant_grid(_csv(args.targets), _csv(args.precisions))),
        threshold_overrides=parse_threshold_overrides(args.threshold),
        version=args.version,
        allow_off_target_validation=args.allow_off_target_validation,
    )
    result = build_bundle(
        spec, Path(args.out), force=args.force, work_dir=Path(args.work_dir) if args.work_dir else None
    )
    print(format_summary(result.export, result.records))
    print(f"bundle: {args.out} ({', '.join(v.id for v in result.manifest.variants)})")
    return 0


def _pipeline_arguments(args: argparse.Namespace, *, local_model: bool) -> tuple[list[str], dict[str, Any], str]:
    """Validate the pipeline options before anything heavy; return (targets, arguments, name).

    `local_model` checks that the model exists here (`run`); a submitted run resolves the model
    inside the cluster's component image instead.
    """
    from components.core.errors import InvalidSpecError
    from components.core.sources import resolve_model_source
    from components.core.specs import BuildSpec, parse_threshold_overrides, variant_grid

    if local_model:
        source, default_name = resolve_model_source(args.model, args.task)
        spec = export_spec(args, source, default_name)  # --weights and --labels must exist here
    elif not args.model.strip():
        raise InvalidSpecError("--model is empty")
    else:
        spec = export_spec(args, args.model, Path(args.model.rstrip("/")).name, local_files=False)
    variants = variant_grid(_csv(args.targets), _csv(args.precisions))
    overrides = parse_threshold_overrides(args.threshold)
    name = spec.name
    # validates the task, name, max length and every threshold override
    BuildSpec(export=spec, variants=tuple(variants), threshold_overrides=overrides, version=args.version)
    targets = list(dict.fromkeys(v.target for v in variants))
    arguments: dict[str, Any] = {
        "model": args.model,
        "task": args.task,
        "name": name,
        "max_length": args.max_length or 0,
        "weights": spec.weights or "",
        "labels": spec.labels or "",
        "preprocessing": {
            k: v
            for k, v in (
                ("resize_size", spec.resize_size),
                ("crop_size", spec.crop_size),
                ("mean", list(spec.mean or [])),
                ("std", list(spec.std or [])),
            )
            if v
        },
        "thresholds": overrides,
        "version": args.version,
        "allow_degenerate_reference": spec.allow_degenerate_reference,
        "allow_off_target_validation": args.allow_off_target_validation,
    }
    for target in targets:
        arguments[f"{target}_precisions"] = [v.precision for v in variants if v.target == target]
    return targets, arguments, name


def cmd_run(args: argparse.Namespace) -> int:
    from components.core.errors import InvalidSpecError
    from components.core.report import format_summary
    from pipelines.local import load_run_records, run_pipeline_locally
    from pipelines.package_model import make_pipeline

    targets, arguments, name = _pipeline_arguments(args, local_model=True)
    if not args.model.startswith("/") and Path(args.model).exists():
        arguments["model"] = str(Path(args.model).resolve())  # steps may run in another directory
    out = Path(args.out or Path("dist") / name)
    if out.exists() and not args.force:
        raise InvalidSpecError(f"output directory exists: {out} (use --force to replace it, or --out)")
    log.info(
        "running the %s pipeline locally (kfp.local) for %s: %s",
        "package-model",
        name,
        ", ".join(f"{t} {'/'.join(arguments[f'{t}_precisions'])}" for t in targets),
    )
    result = run_pipeline_locally(
        make_pipeline(targets, parallelism=1),
        arguments,
        pipeline_root=Path(args.pipeline_root),
        out_dir=out,
        force=args.force,
        verbose=args.verbose > 0,
        echo=lambda line: log.info("  %s", line.strip()),
    )
    export, records = load_run_records(result.run_dir)
    print(format_summary(export, records))
    print(f"bundle: {out} ({', '.join(r.variant_id for r in records if r.passed)}), report: {out / 'report.html'}")
    print(f"run: {result.run_dir} (log: {result.log_file})")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines.golden import compile_pipeline

    targets = tuple(_csv(args.targets))
    from components.core.specs import get_target

    for t in targets:
        get_target(t)
    compile_pipeline(Path(args.out), targets)
    print(args.out)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from pipelines.package_model import make_pipeline
    from pipelines.submit import submit_run

    targets, arguments, name = _pipeline_arguments(args, local_model=False)
    run = submit_run(
        make_pipeline(targets, parallelism=1),
        arguments,
        host=args.host,
        experiment=args.experiment,
        run_name=args.run_name or f"{name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
        namespace=args.namespace,
        token=os.environ.get(args.token_env) or None,
    )
    print(f"submitted run {run.run_id} (experiment {run.experiment_id}): {run.url}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from components.core.export import export_model
    from components.core.sources import resolve_model_source

    source, default_name = resolve_model_source(args.model, args.task)
    spec = export_spec(args, source, default_name)
    out = _fresh_dir(Path(args.out), args.force)
    export_model(spec, out)
    print(out)
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    from components.core.optimize import optimize_model
    from components.core.specs import VariantSpec

    variant = VariantSpec(target=args.target, precision=args.precision)
    export_dir = _existing_dir(args.export, "export")
    out = _fresh_dir(Path(args.out), args.force)
    optimize_model(export_dir, variant, out)
    print(out)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from components.core.artifacts import ExportResult, OptimizeResult
    from components.core.parity import validate_variant
    from components.core.specs import parse_threshold_overrides, thresholds_for

    export_dir = _existing_dir(args.export, "export")
    variant_dir = _existing_dir(args.variant, "variant")
    export, built = ExportResult.load(export_dir), OptimizeResult.load(variant_dir)
    thresholds = thresholds_for(export.task, built.precision, parse_threshold_overrides(args.threshold))
    report = validate_variant(variant_dir, export_dir, thresholds, allow_off_target=args.allow_off_target_validation)
    for name, value in sorted(report.values.items()):
        print(f"{name:32s} {value:.6g}")
    report.raise_if_failed()
    return 0


def cmd_benchmark(args: argparse.Namespace) -> int:
    from components.core.benchmark import benchmark_variant

    result = benchmark_variant(_existing_dir(args.variant, "variant"), _existing_dir(args.export, "export"))
    for name, value in sorted(result.metrics().items()):
        print(f"{name:32s} {value:.4g}")
    return 0


def cmd_package(args: argparse.Namespace) -> int:
    from components.core.package import package_dirs

    manifest = package_dirs(
        _existing_dir(args.export, "export"),
        [_existing_dir(v, "variant") for v in args.variant],
        Path(args.out),
        version=args.version,
        force=args.force,
    )
    print(f"bundle: {args.out} ({', '.join(v.id for v in manifest.variants)})")
    return 0


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from serving.bundle import verify_bundle

    manifest = verify_bundle(Path(args.bundle))
    size = sum(f.bytes for f in manifest.files.values())
    signed = ""
    if args.trust_key:
        from serving.signing import verify_signature

        signature = verify_signature(Path(args.bundle), Path(args.trust_key))
        signed = f", signature verified ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})"
    else:
        _warn_unchecked_signature(Path(args.bundle))
    print(
        f"ok: {manifest.name} {manifest.version} ({manifest.task}), variants "
        f"{', '.join(v.id for v in manifest.variants)}, {len(manifest.files)} files, {size / 1e6:.1f} MB verified"
        f"{signed}"
    )
    return 0


def cmd_bundle_check(args: argparse.Namespace) -> int:
    """The serving node's start-up check as a deploy job's pre-flight: verify the bundle, then
    replay its probe set through the variant (`auto`: the one a server would pick, falling back
    as it would) on this machine, and apply the variant's gate."""
    from components.core.errors import ParityError
    from serving.config import ServeConfig
    from serving.hardware import this_machine
    from serving.metrics import Metrics
    from serving.service import NodeCheckError, load_service

    bundle = _existing_dir(args.bundle, "bundle")
    if args.trust_key:
        from serving.signing import verify_signature

        verify_signature(bundle, Path(args.trust_key))
    config = ServeConfig(bundle=args.bundle, variant=args.variant, warmup=False, workers=1)
    print(f"machine: {this_machine().summary()}")
    try:
        service = load_service(bundle, config, Metrics())
    except NodeCheckError as exc:
        raise ParityError(str(exc)) from None
    for result in [*service.rejected, service.node_check]:
        if result is None:
            continue
        numbers = ", ".join(f"{k} {v:.6g}" for k, v in sorted(result.values.items()))
        print(f"{result.variant_id}: {'passed' if result.passed else 'MISSED'} ({result.samples} probes, {numbers})")
        if not result.passed:
            print(f"  {result.summary()}")
    if service.node_check is None:
        print(f"{service.variant.id}: not checked (the bundle has no probe set)")
    print(f"a server here would serve {service.variant.id}")
    return 0


def _warn_unchecked_signature(bundle: Path) -> None:
    from serving.signing import has_signature

    if has_signature(bundle):
        log.warning("the bundle's signature (model.sig) was not checked: pass --trust-key PUB.pem to verify it")
    else:
        log.warning("the bundle is unsigned: nothing proves who made it (ortpack bundle sign)")


def cmd_bundle_sign(args: argparse.Namespace) -> int:
    from serving.signing import sign_bundle

    password = os.environ.get(args.key_password_env) if args.key_password_env else None
    signature = sign_bundle(Path(args.bundle), Path(args.key), password=password)
    print(f"signed: {signature.path} ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})")
    return 0


def cmd_bundle_push(args: argparse.Namespace) -> int:
    from serving.oci import push_bundle

    bundle = Path(args.bundle)
    if args.trust_key:
        from serving.signing import verify_signature

        verify_signature(bundle, Path(args.trust_key))
    log.info("pushing %s to %s", bundle, args.reference)
    print(push_bundle(bundle, args.reference))  # verifies the bundle's checksums first
    return 0


def cmd_bundle_pull(args: argparse.Namespace) -> int:
    import shutil

    from serving.bundle import verify_bundle
    from serving.oci import pull_bundle

    out = Path(args.out)
    pinned = pull_bundle(args.reference, out)
    try:
        manifest = verify_bundle(out)
        if args.trust_key:
            from serving.signing import verify_signature

            verify_signature(out, Path(args.trust_key))
        else:
            _warn_unchecked_signature(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # never leave a bundle that failed verification
        raise
    print(f"pulled: {out} ({manifest.name} {manifest.version}) from {pinned}")
    return 0


def _existing_dir(value: str, what: str) -> Path:
    path = Path(value)
    if not path.is_dir():
        from components.core.errors import InvalidSpecError

        raise InvalidSpecError(f"{what} directory not found: {value}")
    return path


def _fresh_dir(path: Path, force: bool) -> Path:
    from components.core.errors import InvalidSpecError

    if path.exists():
        if not force:
            raise InvalidSpecError(f"output directory exists: {path} (use --force to replace it)")
        import shutil

        shutil.rmtree(path)
    return path


# ---------------------------------------------------------------------------- parser


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="count", default=0, help="print only warnings and the result")
    p.add_argument("-v", "--verbose", action="count", default=0, help="print debug progress")
    p.add_argument(
        "--debug",
        action="store_true",
        default=bool(os.environ.get("ORTPACK_DEBUG")),
        help="show library warnings and full tracebacks (also ORTPACK_DEBUG=1)",
    )


def _add_model(p: argparse.ArgumentParser, required: bool = True) -> None:
    if required:
        p.add_argument(
            "--model", required=True, help="a Hugging Face checkpoint directory, or a bundled model (all-MiniLM-L6-v2)"
        )
    else:
        p.add_argument(
            "--model",
            default="all-MiniLM-L6-v2",
            help="a Hugging Face checkpoint directory, or a bundled model (default: all-MiniLM-L6-v2)",
        )
    p.add_argument("--task", default="text-embedding", help="text-embedding (default) or image-classification")
    p.add_argument("--name", help="bundle name (default: the model's directory or name)")
    p.add_argument("--max-length", type=int, help="token limit of text models (default: the model's own)")
    p.add_argument(
        "--weights",
        help="image models: a state-dict file (.safetensors, or a torch file loaded with "
        "weights_only); default: random weights",
    )
    p.add_argument("--labels", help="image models: a labels file, one per line (default: the weights' categories)")
    p.add_argument("--resize-size", type=int, help="image models: shorter side after resize (default: the weights')")
    p.add_argument("--crop-size", type=int, help="image models: centre crop size (default: the weights')")
    p.add_argument("--mean", type=_floats3, help="image models: normalisation mean, 3 comma-separated numbers")
    p.add_argument("--std", type=_floats3, help="image models: normalisation std, 3 comma-separated numbers")
    p.add_argument(
        "--allow-degenerate-reference",
        action="store_true",
        help="build even when the PyTorch outputs barely vary across inputs (random weights): every parity "
        "check is then vacuous, and the report says so",
    )


def _add_variants(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", default="cpu", help="comma-separated target presets: cpu, cuda (default: cpu)")
    p.add_argument(
        "--precisions",
        default="fp32,int8",
        help="comma-separated precisions: fp32, int8 (cpu), fp16 (cuda) (default: fp32,int8)",
    )
    p.add_argument("--version", default="1", help="bundle version written to the manifest (default: 1)")
    _add_thresholds(p)
    _add_off_target(p)


def _add_off_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-off-target-validation",
        action="store_true",
        help="ship a variant validated on another execution provider than its target's (a cuda variant "
        "checked on the CPU provider because this onnxruntime has no CUDA); the report marks it",
    )


def _add_thresholds(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[PRECISION.]NAME=VALUE",
        help="override a parity threshold, e.g. int8.min_neighbour_agreement=0.9 or max_abs_diff=1e-5 "
        "(names: max_abs_diff, mean_abs_diff, min_cosine, mean_cosine, min_neighbour_agreement); repeatable",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ortpack",
        description="Turn a PyTorch model into a verified, hardware-optimized ONNX Runtime bundle.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=fn)
        _add_common(p)
        return p

    p = command("run", cmd_run, "run the package_model Kubeflow pipeline on this machine (kfp.local)")
    _add_model(p, required=False)
    _add_variants(p)
    p.add_argument("--out", help="bundle directory to create (default: dist/<name>)")
    p.add_argument(
        "--pipeline-root",
        default=os.environ.get("ORTPACK_PIPELINE_ROOT", ".ortpack/runs"),
        help="where kfp.local keeps each run's artifacts (default: .ortpack/runs, or ORTPACK_PIPELINE_ROOT)",
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    p = command("compile", cmd_compile, "compile the package_model pipeline to KFP YAML (byte-identical every time)")
    p.add_argument("--out", default="package_model.yaml", help="YAML file to write (default: package_model.yaml)")
    p.add_argument("--targets", default="cpu,cuda", help="targets the pipeline has branches for (default: cpu,cuda)")

    p = command("submit", cmd_submit, "compile the pipeline and start a run on a Kubeflow Pipelines endpoint")
    p.add_argument("--host", required=True, help="Kubeflow Pipelines API endpoint, e.g. https://kfp.example.com")
    _add_model(p, required=False)
    _add_variants(p)
    p.add_argument("--experiment", default="ortpack", help="experiment to add the run to (default: ortpack)")
    p.add_argument("--run-name", help="run name (default: '<name> <date time>')")
    p.add_argument("--namespace", help="Kubernetes namespace of a multi-user deployment")
    p.add_argument(
        "--token-env",
        default="KFP_TOKEN",
        help="environment variable holding a bearer token for the endpoint (default: KFP_TOKEN)",
    )

    p = command("build", cmd_build, "export, optimize, validate, benchmark and package in one process (no KFP)")
    _add_model(p)
    _add_variants(p)
    p.add_argument("--out", required=True, help="bundle directory to create, e.g. dist/all-MiniLM-L6-v2")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--work-dir", help="keep intermediate step outputs here (default: a temporary directory)")

    p = command("export", cmd_export, "export a model to ONNX with the PyTorch reference outputs")
    _add_model(p)
    p.add_argument("--out", required=True, help="directory to write (model.onnx, reference.npz, export.json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    p = command("optimize", cmd_optimize, "build one variant (target x precision) from an export")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--target", required=True, help="target preset: cpu or cuda")
    p.add_argument("--precision", required=True, help="fp32 or int8 (cpu), fp16 or fp32 (cuda)")
    p.add_argument("--out", required=True, help="directory to write (model.onnx, optimize.json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    p = command("validate", cmd_validate, "run the parity gate on one variant (exit 1 when it misses)")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, help="directory written by `ortpack optimize`")
    _add_thresholds(p)
    _add_off_target(p)

    p = command("benchmark", cmd_benchmark, "measure one variant's latency against PyTorch")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, help="directory written by `ortpack optimize`")

    p = command("package", cmd_package, "write a bundle from validated variants")
    p.add_argument("--export", required=True, help="directory written by `ortpack export`")
    p.add_argument("--variant", required=True, action="append", help="a validated variant directory; repeatable")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--version", default="1", help="bundle version written to the manifest (default: 1)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    _add_bundle_commands(sub)
    return parser


def _add_bundle_commands(sub: Any) -> None:
    """`ortpack bundle ACTION`: one `action(...)` call per action, plus its own arguments."""
    bundle = sub.add_parser(
        "bundle", help="verify, sign, push and pull bundles", description="verify, sign, push and pull bundles"
    )
    bsub = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")

    def action(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = bsub.add_parser(name, help=help_, description=help_)
        p.set_defaults(func=fn)
        _add_common(p)
        return p

    def trust_key(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument(
            "--trust-key",
            default=os.environ.get("ORTPACK_TRUST_KEY") or None,
            metavar="PUB.pem",
            help=f"EC public key (PEM): {what} unless the bundle's model.sig verifies with it and covers every "
            "file (also ORTPACK_TRUST_KEY)",
        )

    p = action("verify", cmd_bundle_verify, "check a bundle's schema version, every file's sha256, and its signature")
    p.add_argument("bundle", help="bundle directory")
    trust_key(p, "fail")

    p = action(
        "check",
        cmd_bundle_check,
        "replay the bundle's probe set through a variant on this machine and apply its gate (exit 1 on a miss)",
    )
    p.add_argument("bundle", help="bundle directory")
    p.add_argument("--variant", default="auto", help="variant id, or auto (what a server would pick; the default)")
    trust_key(p, "fail")

    p = action("sign", cmd_bundle_sign, "sign every file of a bundle (OpenSSF model signing) into BUNDLE/model.sig")
    p.add_argument("bundle", help="bundle directory (verified before signing)")
    p.add_argument("--key", required=True, metavar="KEY.pem", help="EC private key (PEM; P-256, P-384 or P-521)")
    p.add_argument(
        "--key-password-env",
        metavar="VAR",
        help="environment variable holding the private key's password, if it is encrypted",
    )

    p = action("push", cmd_bundle_push, "push a bundle to an OCI registry; print its pinned oci://...@sha256: URI")
    p.add_argument("bundle", help="bundle directory (verified before pushing)")
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO:TAG", help="where to push")
    trust_key(p, "refuse to push")

    p = action("pull", cmd_bundle_pull, "pull a bundle from an OCI registry, check every digest, and verify it")
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO@sha256:...|:TAG", help="what to pull")
    p.add_argument("--out", required=True, help="bundle directory to create (must not exist)")
    trust_key(p, "fail (and remove --out)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(-args.quiet + args.verbose, args.debug)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("ortpack: interrupted", file=sys.stderr)
        return EXIT_INTERRUPT
    except Exception as exc:
        if args.debug:
            raise
        return _report(exc)


def _report(exc: Exception) -> int:
    from components.core.errors import OrtpackError, ParityError

    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ParityError):
        code = EXIT_GATE
    elif isinstance(exc, ValueError):
        code = EXIT_INPUT
    elif isinstance(exc, RuntimeError | OSError):
        code = EXIT_ENV
    else:
        code = EXIT_INTERNAL
    if code == EXIT_INTERNAL or not isinstance(exc, OrtpackError | ValueError | OSError | RuntimeError):
        message = f"internal error: {type(exc).__name__}: {message} (run again with --debug for the traceback)"
    print(f"ortpack: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
