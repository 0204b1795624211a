"""The `ortpack` command line.

Every command validates its options before heavy work, prints progress to stderr, and on
failure prints one line `ortpack: error: ...` and exits non-zero:

    0  success
    1  the parity gate failed (nothing was shipped)
    2  bad input: options, paths, models, bundles
    3  this environment cannot do it (a missing provider, a full disk, ...)
   70  an internal error (a bug: run again with --debug for the traceback)
  130  interrupted (SIGINT); 143 terminated (SIGTERM), after the same clean-up

`ortpack bundle diff` answers with its verdict instead: 0 drop-in, 3 re-index, 4 incompatible (and 2
for anything that stops the comparison, an unreachable source included).

`--debug` prints the traceback too and keeps the exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from components.core.errors import one_line

EXIT_GATE, EXIT_INPUT, EXIT_ENV, EXIT_INTERNAL, EXIT_INTERRUPT = 1, 2, 3, 70, 130
REQUIRE_ENV = "ORTPACK_REQUIRE"  # `bundle verify --require`'s default, as ortpack-serve reads it
DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # pipelines.submit.DEFAULT_PIPELINE_ROOT

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


# The task options that have a flag of their own (every option also has `--task-option KEY=VALUE`)
OPTION_FLAGS = (
    "max_length",
    "weights",
    "labels",
    "resize_size",
    "crop_size",
    "mean",
    "std",
    "validation_images",
    "calibration_images",
)


def _task_options(args: argparse.Namespace) -> dict[str, Any]:
    """The task options given: their own flags, then `--task-option KEY=VALUE` (VALUE read as
    JSON when it parses, else as a string); the task's contract checks them (`export_parameters`)."""
    from components.core.errors import InvalidSpecError

    given = {key: getattr(args, key) for key in OPTION_FLAGS if getattr(args, key, None) is not None}
    for item in getattr(args, "task_option", None) or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidSpecError(f"--task-option {item!r} must look like KEY=VALUE (max_length=128)")
        if key in given:
            raise InvalidSpecError(f"--task-option {key} is given twice (or also by its own flag)")
        try:
            given[key] = json.loads(raw)
        except ValueError:
            given[key] = raw
    return given


def _model_parameters(args: argparse.Namespace, *, local: bool = True) -> dict[str, Any]:
    """The export parameters of a command's model options (components.core.build: one mapping
    from options to specs, shared with the pipeline's export step). `local`: directories of photos
    must exist here, and are named by absolute path (steps may run in another directory)."""
    from components.core.build import export_parameters
    from components.core.errors import InvalidSpecError
    from serving.contracts import get_contract

    params = export_parameters(
        task=args.task,
        name=args.name,
        task_options=_task_options(args),
        allow_degenerate_reference=args.allow_degenerate_reference,
    )
    options = params["task_options"]
    for key in get_contract(args.task).options.DIRECTORIES:
        value = options.get(key)
        if value and local:
            path = Path(value).expanduser()
            if not path.is_dir():
                raise InvalidSpecError(f"--{key.replace('_', '-')}: not a directory: {value}")
            options[key] = str(path.resolve())
    return params


def export_spec(args: argparse.Namespace) -> Any:
    """The ExportSpec of a command's model options, for a model and files on this machine
    (validated: bad values fail here, before work)."""
    from components.core.build import export_spec_from_parameters
    from components.core.sources import check_local_file
    from components.core.tasks import resolve_model_source
    from serving.contracts import get_contract

    params = _model_parameters(args)
    options = params["task_options"]
    for key in get_contract(args.task).options.FILES:  # weights, labels: files on this machine
        if options.get(key):
            options[key] = check_local_file(options[key], key)
    source, default_name = resolve_model_source(args.model, args.task)
    return export_spec_from_parameters(params, source=source, default_name=default_name)


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items


# ---------------------------------------------------------------------------- commands


def cmd_build(args: argparse.Namespace) -> int:
    from components.core.build import build_bundle, resolve_version
    from components.core.report import format_summary
    from components.core.specs import BuildSpec, variant_grid
    from components.core.tasks import check_build_spec

    spec = BuildSpec(
        export=export_spec(args),
        variants=tuple(variant_grid(_csv(args.targets), _csv(args.precisions))),
        threshold_overrides=_overrides(args),
        version=resolve_version(args.version or "", uuid.uuid4().hex),
        allow_off_target_validation=args.allow_off_target_validation,
        int8_recipe=args.int8_recipe or None,
    )
    check_build_spec(spec)
    result = build_bundle(
        spec, Path(args.out), force=args.force, work_dir=Path(args.work_dir) if args.work_dir else None
    )
    print(format_summary(result.export, result.records))
    print(f"bundle: {args.out} ({', '.join(v.id for v in result.manifest.variants)}), version {spec.version}")
    return 0


def _pipeline_arguments(args: argparse.Namespace, *, local: bool) -> tuple[list[str], dict[str, Any], str]:
    """Validate the pipeline options before anything heavy; return (targets, arguments, name).

    A model URI is checked for form here and fetched by the export step. `local` (`run`) checks
    that a model path and --weights/--labels paths exist here; a submitted run reads them in the
    cluster's component image (or a mounted volume) instead."""
    from components.core.build import resolve_version
    from components.core.errors import InvalidSpecError
    from components.core.sources import check_local_file, check_uri, default_name, is_remote
    from components.core.tasks import resolve_model_source
    from serving.contracts import get_contract

    model = args.model.strip()
    if not model:
        raise InvalidSpecError("--model is empty")
    params = _model_parameters(args, local=local)
    options = params["task_options"]
    for key in get_contract(args.task).options.FILES:  # weights, labels: a URI the export step fetches
        value = options.get(key)
        if value and is_remote(value):
            check_uri(value)
        elif value and local:
            options[key] = check_local_file(value, key)
    if is_remote(model):
        check_uri(model)
        source, name = model, default_name(model)
    elif local:
        source, name = resolve_model_source(model, args.task)  # the model must exist here
        if Path(model).expanduser().exists():
            model = str(Path(model).expanduser().resolve())  # steps may run in another directory
    else:
        check_uri(model)
        source, name = model, default_name(model)
    arguments: dict[str, Any] = {"model_uri": model, **params}
    arguments.update(
        thresholds=_overrides(args),
        version=resolve_version(args.version or "", uuid.uuid4().hex),
        allow_off_target_validation=args.allow_off_target_validation,
        int8_recipe=(args.int8_recipe or "").strip(),
        publish_to=(args.publish_to or "").strip(),
        **_baseline_parameters(args, local=local),
    )
    targets = _validate_arguments(
        arguments, source=source, default_name=name, targets=_csv(args.targets), precisions=_csv(args.precisions)
    )
    return targets, arguments, str(arguments["name"])


def _baseline_parameters(args: argparse.Namespace, *, local: bool) -> dict[str, Any]:
    """The baseline comparison's pipeline parameters. `local` (`run`): a path must name a bundle
    here (a directory, its manifest.json, or a .tar), and is passed by absolute path; a directory
    must hold a text-embedding bundle. `submit` passes a path as is (the package step reads it)."""
    from components.core.errors import InvalidSpecError
    from pipelines.package_model import COMPATIBILITY_BUDGET

    baseline = (args.baseline_bundle or "").strip()
    if not baseline and (args.require_compatible or args.compatibility_budget is not None):
        given = "--require-compatible" if args.require_compatible else "--compatibility-budget"
        raise InvalidSpecError(f"{given} applies only with --baseline-bundle")
    if baseline and local and "://" not in baseline:
        from components.core.tasks import get_family
        from serving.bundle import MANIFEST_NAME, read_manifest

        path = Path(baseline).expanduser()
        path = path.parent if path.name == MANIFEST_NAME else path
        if not path.exists():
            raise InvalidSpecError(f"--baseline-bundle: no bundle at {baseline}")
        if path.is_dir():
            manifest = read_manifest(path)
            if not get_family(manifest.task).embedding_space:
                raise InvalidSpecError(
                    f"--baseline-bundle: {baseline} is a {manifest.task} bundle; only text-embedding bundles "
                    "are compared (as `ortpack bundle diff` does)"
                )
        baseline = str(path.resolve())  # steps may run in another directory
    budget = args.compatibility_budget
    return {
        "baseline_bundle": baseline,
        "require_compatible": bool(args.require_compatible),
        "compatibility_budget": COMPATIBILITY_BUDGET if budget is None else float(budget),
    }


# the schemes serving.sources fetches a bundle from (with plain paths)
BUNDLE_SCHEMES = ("file", "http", "https", "s3", "minio", "oci")


def _validate_baseline(arguments: dict[str, Any]) -> None:
    """Refuse a baseline comparison the package step could not make, before any step runs."""
    from components.core.errors import InvalidSpecError
    from components.core.sources import uri_scheme

    baseline = str(arguments.get("baseline_bundle") or "")
    if not baseline:
        if arguments.get("require_compatible"):
            raise InvalidSpecError("require_compatible needs a baseline bundle (--baseline-bundle URI)")
        return
    from components.core.tasks import get_family

    task = str(arguments.get("task"))
    if not get_family(task).embedding_space:
        raise InvalidSpecError(
            f"--baseline-bundle compares text-embedding bundles (as `ortpack bundle diff` does); this run "
            f"packages a {task} model"
        )
    budget = arguments.get("compatibility_budget")
    if not isinstance(budget, int | float) or isinstance(budget, bool) or not 0.0 < budget <= 1.0:
        raise InvalidSpecError(f"--compatibility-budget must be in (0, 1], got {budget}")
    scheme = uri_scheme(baseline)
    if scheme and scheme not in BUNDLE_SCHEMES:
        raise InvalidSpecError(
            f"--baseline-bundle takes a bundle directory or URI ({', '.join(f'{s}://' for s in BUNDLE_SCHEMES)}): "
            f"{baseline}"
        )


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    from components.core.specs import parse_threshold_overrides

    return parse_threshold_overrides(args.threshold)


def _validate_arguments(
    arguments: dict[str, Any], *, source: str, default_name: str, targets: list[str], precisions: list[str]
) -> list[str]:
    """Check pipeline arguments as the steps will read them (the export spec, every variant's
    gate, the publish destination); fill in the name and the per-target precisions; return the
    targets in use."""
    from components.core.build import export_spec_from_parameters
    from components.core.errors import InvalidSpecError
    from components.core.specs import BuildSpec, variant_grid
    from components.core.tasks import check_build_spec

    spec = export_spec_from_parameters(arguments, source=source, default_name=default_name)
    variants = variant_grid(targets, precisions)
    check_build_spec(
        BuildSpec(
            export=spec,
            variants=tuple(variants),
            threshold_overrides=arguments.get("thresholds") or {},
            int8_recipe=arguments.get("int8_recipe") or None,
        )
    )
    arguments["name"] = spec.name
    in_use = list(dict.fromkeys(v.target for v in variants))
    for target in in_use:
        arguments[f"{target}_precisions"] = [v.precision for v in variants if v.target == target]
    _validate_baseline(arguments)
    publish_to = arguments.get("publish_to") or ""
    if publish_to:
        from components.core.sources import uri_scheme

        scheme = uri_scheme(publish_to)
        if scheme not in ("oci", "s3", "minio"):
            raise InvalidSpecError(
                f"--publish-to takes oci://HOST/REPO[:TAG] or s3://BUCKET/PREFIX/ (or minio://): {publish_to}"
            )
        if scheme == "oci":
            from serving.oci import OciReference

            ref = OciReference.parse(publish_to)
            if ref.digest:
                raise InvalidSpecError(f"--publish-to names a digest; give a repository or a tag: {publish_to}")
            if not ref.tag:
                OciReference.parse(f"{publish_to}:{arguments['version']}")  # the version must be a valid tag
    return in_use


def _graph_options(args: argparse.Namespace, targets: list[str]) -> Any:
    """What shapes the compiled YAML, from the options (and ORTPACK_COMPONENT_IMAGE /
    ORTPACK_GPU_COMPONENT_IMAGE): `compile` and `submit` build the same YAML from the same options."""
    from components.core.errors import InvalidSpecError
    from components.images import GPU_IMAGE_ENV, IMAGE_ENV, check_image, gpu_image_for
    from pipelines.golden import GraphOptions

    image = args.component_image or os.environ.get(IMAGE_ENV) or None
    gpu_image = args.gpu_component_image or os.environ.get(GPU_IMAGE_ENV) or None
    try:
        image = check_image(image) if image else None
        if gpu_image:
            gpu_image = check_image(gpu_image)
        elif image and "cuda" in targets:
            gpu_image = gpu_image_for(image)
    except ValueError as exc:
        raise InvalidSpecError(str(exc)) from None
    if args.gpu_timeout <= 0:
        raise InvalidSpecError(f"--gpu-timeout must be > 0 seconds, got {args.gpu_timeout}")
    return GraphOptions(
        targets=tuple(targets),
        image=image,
        gpu_image=gpu_image,
        model_pvc=args.model_pvc or None,
        gpu_timeout_s=args.gpu_timeout,
        cache=not args.no_cache,
    )


def _print_published(run_dir: Path) -> None:
    from pipelines.local import published_uri

    uri = published_uri(run_dir)
    if uri:
        print(f"published: {uri}")


def _print_compatibility(run_dir: Path) -> None:
    """The verdict against the baseline bundle, in one line, when the run compared with one."""
    from pipelines.local import run_verdict

    verdict = run_verdict(run_dir)
    if verdict is not None and verdict.compatibility:
        print(f"compatibility: {verdict.compatibility['summary']}")


def cmd_run(args: argparse.Namespace) -> int:
    from components.core.errors import InvalidSpecError
    from components.core.report import format_summary
    from pipelines.local import load_run_records, run_pipeline_locally
    from pipelines.package_model import make_pipeline

    targets, arguments, name = _pipeline_arguments(args, local=True)
    run_id = uuid.uuid4().hex[:12]
    if args.sign_key:
        key = Path(args.sign_key).expanduser()
        if not key.is_file():
            raise InvalidSpecError(f"signing key not found: {args.sign_key}")
        arguments["sign_key"] = str(key.resolve())
    out = Path(args.out or Path("dist") / name)
    if out.exists() and not args.force:
        raise InvalidSpecError(f"output directory exists: {out} (use --force to replace it, or --out)")
    runner, image = None, None
    if args.runner == "docker":
        from components.images import COMPONENT_IMAGE, IMAGE_ENV, check_image
        from pipelines.local import docker_runner, stage_local_inputs
        from serving.contracts import get_contract

        try:
            image = check_image(args.component_image or os.environ.get(IMAGE_ENV) or COMPONENT_IMAGE)
        except ValueError as exc:
            raise InvalidSpecError(str(exc)) from None
        runner = docker_runner(image, run_id)
        root = Path(args.pipeline_root)
        arguments = stage_local_inputs(arguments, ("model_uri", "sign_key", "baseline_bundle"), root)
        kind = get_contract(str(arguments["task"])).options
        arguments["task_options"] = stage_local_inputs(
            arguments["task_options"], (*kind.FILES, *kind.DIRECTORIES), root
        )
    log.info(
        "running the %s pipeline locally (kfp.local, %s) for %s %s: %s",
        "package-model",
        f"each step in {image}" if image else "steps as subprocesses here",
        name,
        arguments["version"],
        ", ".join(f"{t} {'/'.join(arguments[f'{t}_precisions'])}" for t in targets),
    )
    try:
        result = run_pipeline_locally(
            make_pipeline(targets, parallelism=1, image=image),
            arguments,
            pipeline_root=Path(args.pipeline_root),
            out_dir=out,
            force=args.force,
            verbose=args.verbose > 0,
            echo=lambda line: log.info("  %s", line.strip()),
            runner=runner,
            # resolve, export, then optimize, validate and benchmark per variant, package, gate, publish
            total_steps=4 + 3 * sum(len(arguments[f"{t}_precisions"]) for t in targets) + bool(arguments["publish_to"]),
        )
    finally:
        if runner is not None:
            from pipelines.local import remove_run_containers

            remove_run_containers(run_id)
    export, records = load_run_records(result.run_dir)
    print(format_summary(export, records))
    print(f"bundle: {out} ({', '.join(r.variant_id for r in records if r.passed)}), report: {out / 'report.html'}")
    _print_compatibility(result.run_dir)
    _print_published(result.run_dir)
    print(f"run: {result.run_dir} (log: {result.log_file})")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from components.core.specs import get_target
    from pipelines.golden import compile_pipeline

    targets = _csv(args.targets)
    for t in targets:
        get_target(t)
    compile_pipeline(Path(args.out), _graph_options(args, targets))
    print(args.out)
    return 0


def _read_params(path: str) -> dict[str, Any]:
    import yaml

    from components.core.errors import InvalidSpecError

    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidSpecError(f"cannot read --params {path}: {one_line(exc, 200)}") from None
    if not isinstance(loaded, dict):
        raise InvalidSpecError(f"--params {path} must be a mapping of pipeline parameters")
    return loaded


def cmd_submit(args: argparse.Namespace) -> int:
    import tempfile

    from components.core.errors import InvalidSpecError
    from pipelines.golden import compile_pipeline, pipeline_parameters
    from pipelines.package_model import PIPELINE_NAME, SIGNING_KEY
    from pipelines.submit import find_bundle, follow_run, pinned_publish_uri, submit_run

    targets, arguments, name = _pipeline_arguments(args, local=False)
    options = _graph_options(args, targets)
    arguments.update(credentials_secret=args.secret, signing_secret=args.signing_secret)
    if args.sign:
        arguments["sign_key"] = SIGNING_KEY
    if args.params:
        extra = _read_params(args.params)
        known = pipeline_parameters(options)
        unknown = sorted(set(extra) - known)
        if unknown:
            raise InvalidSpecError(
                f"--params: unknown pipeline parameter {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        arguments.update(extra)
        precisions = [p for t in targets for p in arguments.get(f"{t}_precisions", [])]
        _validate_arguments(
            arguments, source=str(arguments["model_uri"]), default_name=name, targets=targets, precisions=precisions
        )
    for key in ("credentials_secret", "signing_secret"):
        if not str(arguments.get(key, "")).strip():
            raise InvalidSpecError(f"the {key} name is empty")
    with tempfile.TemporaryDirectory(prefix="ortpack-submit-") as tmp:
        package = Path(tmp) / "package_model.yaml"
        compile_pipeline(package, options)
        client, run = submit_run(
            package,
            arguments,
            host=args.host,
            experiment=args.experiment,
            run_name=args.run_name or f"{arguments['name']} {arguments['version']}",
            namespace=args.namespace,
            token=os.environ.get(args.token_env) or None,
            pipeline_name=args.pipeline_name,
            service_account=args.service_account,
            pipeline_root=args.pipeline_root,
        )
    print(f"submitted run {run.run_id} (experiment {run.experiment_id}, pipeline version {run.version_id}): {run.url}")
    if not args.wait:
        return 0
    finished = follow_run(
        client,
        args.host,
        run.run_id,
        echo=lambda line: log.info("  %s", line),
        timeout_s=args.timeout,
        poll_s=args.poll,
    )
    if not finished.succeeded:
        reason = f": {finished.error}" if finished.error else ""
        print(f"ortpack: error: run {run.run_id} {finished.state.lower()}{reason}", file=sys.stderr)
        return EXIT_GATE
    location = find_bundle(args.pipeline_root or DEFAULT_PIPELINE_ROOT, PIPELINE_NAME, run.run_id)
    digest = f" (manifest sha256 {location.manifest_sha256})" if location.manifest_sha256 else ""
    note = f" ({location.note})" if location.note else ""
    print(f"bundle: {location.uri}{digest}{note}")
    if arguments.get("publish_to"):
        print(f"published: {pinned_publish_uri(str(arguments['publish_to']), name, str(arguments['version']))}")
    print(f"run {run.run_id} succeeded: version {arguments['version']}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from components.core.export import export_model

    spec = export_spec(args)
    out = _fresh_dir(Path(args.out), args.force)
    export_model(spec, out)
    print(out)
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    from components.core.errors import InvalidSpecError
    from components.core.optimize import optimize_model
    from components.core.specs import VariantSpec

    variant = VariantSpec(target=args.target, precision=args.precision)
    export_dir = _existing_dir(args.export, "export")
    if args.int8_recipe and variant.precision != "int8":
        raise InvalidSpecError("--int8-recipe applies only to --precision int8")
    out = _fresh_dir(Path(args.out), args.force)
    optimize_model(export_dir, variant, out, int8_recipe=args.int8_recipe or None)
    print(out)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from components.core.artifacts import ExportResult, OptimizeResult
    from components.core.parity import validate_variant
    from components.core.specs import parse_threshold_overrides
    from components.core.tasks import thresholds_for

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
    """Like the pipeline's package step: report.html (inside the bundle), then the bundle."""
    import tempfile

    from components.core.artifacts import VariantRecord
    from components.core.build import resolve_version
    from components.core.package import package_bundle
    from components.core.report import write_report

    export_dir = _existing_dir(args.export, "export")
    variant_dirs = [_existing_dir(v, "variant") for v in args.variant]
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


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from serving.bundle import embedding_space, verify_bundle
    from serving.policy import admit, parse_requirements, split_expressions

    expressions = args.require if args.require is not None else split_expressions(os.environ.get(REQUIRE_ENV, ""))
    policy = parse_requirements(expressions)  # a malformed expression fails before any work
    bundle = _bundle_dir(args.bundle)
    manifest = verify_bundle(bundle)
    size = sum(f.bytes for f in manifest.files.values())
    signed = ""
    if args.trust_key:
        from serving.signing import verify_signature

        signature = verify_signature(bundle, Path(args.trust_key))
        signed = f", signature verified ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})"
    else:
        _warn_unchecked_signature(bundle)
    admission = admit(manifest, manifest.variants, policy) if policy else None  # none left: exit 2
    print(
        f"ok: {manifest.name} {manifest.version} ({manifest.task}), variants "
        f"{', '.join(v.id for v in manifest.variants)}, {len(manifest.files)} files, {size / 1e6:.1f} MB verified"
        f"{signed}"
    )
    for variant in manifest.variants:
        space = embedding_space(manifest, variant)
        if space is not None:
            print(f"space: {variant.id} {space.id}")
    if admission is not None:
        admitted = ", ".join(v.id for v in admission.admitted)
        print(f"policy: {len(policy)} requirement{'s' if len(policy) > 1 else ''} met by {admitted}")
        for variant_id, misses in admission.excluded.items():
            print(f"policy: {variant_id} would not be served: {'; '.join(misses)}")
    return 0


def cmd_bundle_check(args: argparse.Namespace) -> int:
    """The serving node's start-up check as a deploy job's pre-flight: verify the bundle, then
    replay its probe set through the variant (`auto`: the one a server would pick, falling back
    as it would) on this machine, and apply the variant's gate."""
    from components.core.errors import InvalidSpecError, ParityError, did_you_mean
    from serving.bundle import read_manifest
    from serving.config import ServeConfig
    from serving.hardware import this_machine
    from serving.metrics import Metrics
    from serving.service import NodeCheckError, load_service

    bundle = _existing_dir(str(_bundle_dir(args.bundle)), "bundle")
    if args.trust_key:
        from serving.signing import verify_signature

        verify_signature(bundle, Path(args.trust_key))
    if args.variant != "auto":
        variants = [v.id for v in read_manifest(bundle).variants]
        if args.variant not in variants:
            raise InvalidSpecError(
                f"--variant {args.variant!r} is not in this bundle: give one of {', '.join(variants)}, or auto"
                f"{did_you_mean(args.variant, variants)}"
            )
    config = ServeConfig(bundle=str(bundle), variant=args.variant, warmup=False, workers=1)
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


def cmd_bundle_diff(args: argparse.Namespace) -> int:
    """Exit 0 drop-in, 3 re-index, 4 incompatible; anything that stops the comparison is 2 (an
    unreachable source too: a CI job must never read it as a verdict)."""
    import json

    from components.core.compat import DiffSpec, diff_bundles, read_texts
    from components.core.errors import InvalidSpecError, OrtpackError

    try:
        spec = DiffSpec(
            budget=args.budget,
            all_pairs=args.all_pairs,
            queries=read_texts(Path(args.queries)) if args.queries else (),
            documents=read_texts(Path(args.documents)) if args.documents else (),
            threads=args.threads,
        )
        result = diff_bundles(_bundle_uri(args.old), _bundle_uri(args.new), spec)
    except (OrtpackError, ValueError, OSError, RuntimeError) as exc:
        raise InvalidSpecError(one_line(exc)) from exc
    print(json.dumps(result.as_dict(), indent=2) if args.json else result.table())
    return result.exit_code


def _bundle_uri(value: str) -> str:
    """A bundle URI as given, or the directory a local path names (its manifest.json's folder)."""
    return value if "://" in value else str(_existing_dir(str(_bundle_dir(value)), "bundle"))


def _warn_unchecked_signature(bundle: Path) -> None:
    from serving.signing import has_signature

    if has_signature(bundle):
        log.warning("the bundle's signature (model.sig) was not checked: pass --trust-key PUB.pem to verify it")
    else:
        log.warning("the bundle is unsigned: nothing proves who made it (ortpack bundle sign)")


def cmd_bundle_sign(args: argparse.Namespace) -> int:
    from serving.signing import sign_bundle

    password = os.environ.get(args.key_password_env) if args.key_password_env else None
    signature = sign_bundle(_bundle_dir(args.bundle), Path(args.key), password=password)
    print(f"signed: {signature.path} ({len(signature.files)} files, key sha256 {signature.key_fingerprint[:16]})")
    return 0


def cmd_bundle_push(args: argparse.Namespace) -> int:
    from components.core.errors import InvalidSpecError
    from serving.oci import push_bundle

    bundle = _bundle_dir(args.bundle)
    if args.trust_key:
        from serving.signing import verify_signature

        verify_signature(bundle, Path(args.trust_key))
    if args.modelcar_base and not args.modelcar:
        raise InvalidSpecError("--modelcar-base applies only with --modelcar")
    if args.modelcar:
        from serving.oci import push_modelcar

        if not args.modelcar_base:
            log.warning(
                "the modelcar has no shell: KServe runs it with `sh -c ...`; give --modelcar-base (e.g. busybox)"
            )
        log.info("pushing %s to %s as a KServe modelcar image", bundle, args.reference)
        print(push_modelcar(bundle, args.reference, base=args.modelcar_base))
        return 0
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


def _bundle_dir(value: str) -> Path:
    """The bundle directory an argument names: the directory itself, or its manifest.json (the
    folder holding it is meant). Any other file is refused: a bundle is a directory."""
    from serving.bundle import MANIFEST_NAME

    path = Path(value)
    if path.name == MANIFEST_NAME and not path.is_dir():
        return path.parent
    if path.is_file():
        from components.core.errors import InvalidSpecError

        raise InvalidSpecError(f"{value} is a file: give the bundle directory (the folder holding {MANIFEST_NAME})")
    return path


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
    from serving.contracts import DEFAULT_TASK, contract_names

    if required:
        p.add_argument(
            "--model",
            required=True,
            help="a Hugging Face checkpoint directory, or a bundled model (all-MiniLM-L6-v2); image models: a "
            "torchvision name, PACKAGE.MODULE:FACTORY (your own nn.Module) or a torch.export FILE.pt2",
        )
    else:
        p.add_argument(
            "--model",
            default="all-MiniLM-L6-v2",
            help="a checkpoint: s3://BUCKET/PREFIX/, minio://..., gs://..., https://.../CKPT.tar, "
            "hf://ORG/NAME@REVISION (fetched by the export step), a directory, or a bundled model "
            "(default: all-MiniLM-L6-v2); image models: a torchvision name, PACKAGE.MODULE:FACTORY or FILE.pt2",
        )
    p.add_argument(
        "--task",
        default=DEFAULT_TASK,
        help=f"{DEFAULT_TASK} (default), " + " or ".join(t for t in contract_names() if t != DEFAULT_TASK),
    )
    p.add_argument("--name", help="bundle name (default: the model's directory or name)")
    p.add_argument("--max-length", type=int, help="token limit of text models (default: the model's own)")
    p.add_argument(
        "--weights",
        help="image models: a state-dict file (.safetensors, or a torch file loaded with "
        "weights_only; run/submit: also a URI of a .safetensors file); default: random weights",
    )
    p.add_argument(
        "--labels",
        help="image models: a labels file, one per line, or its URI (default: the weights' categories)",
    )
    p.add_argument("--resize-size", type=int, help="image models: shorter side after resize (default: the weights')")
    p.add_argument("--crop-size", type=int, help="image models: centre crop size (default: the weights')")
    p.add_argument("--mean", type=_floats3, help="image models: normalisation mean, 3 comma-separated numbers")
    p.add_argument("--std", type=_floats3, help="image models: normalisation std, 3 comma-separated numbers")
    p.add_argument(
        "--validation-images",
        metavar="DIR",
        help="image models: a directory of your own photos (JPEG/PNG/WebP, 8 to 1000) the parity gate runs "
        "through the server's decoder (default: generated images)",
    )
    p.add_argument(
        "--calibration-images",
        metavar="DIR",
        help="image models: a directory of photos static int8 is calibrated on, apart from the validation "
        "photos (default: generated images)",
    )
    p.add_argument(
        "--task-option",
        action="append",
        metavar="KEY=VALUE",
        help="any option of the task, by its name in the task's contract (serving/contracts/<task>.py), "
        "e.g. max_length=128; VALUE is read as JSON when it parses (repeatable)",
    )
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
    _add_version(p)
    _add_thresholds(p)
    _add_off_target(p)
    _add_int8_recipe(p)


def _add_int8_recipe(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--int8-recipe",
        metavar="NAME",
        help="build int8 with this recipe instead of searching (text: per-channel, per-tensor, ffn-out-fp32, "
        "each also NAME+int8-embeddings; images: s7, s7-conv, u8-pointwise), e.g. the one a bundle's "
        "optimize record names, to keep its embedding space",
    )


def _add_version(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--version",
        help="bundle version written to the manifest (default: unique per run: UTC time and a run hash, "
        "e.g. 20261130.101500-1a2b3c4d)",
    )


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
        f"(each task gates its own: {'; '.join(_threshold_names())}); repeatable",
    )


def _threshold_names() -> list[str]:
    """Every task's threshold names (serving/contracts/<task>.py), as `task: a, b`."""
    from serving.contracts import contract_names, get_contract

    return [f"{task}: {' '.join(get_contract(task).gates)}" for task in contract_names()]


def _add_graph(p: argparse.ArgumentParser) -> None:
    """Options that shape the compiled YAML (`compile` and `submit` share them)."""
    from components.images import COMPONENT_IMAGE, GPU_IMAGE_ENV, IMAGE_ENV
    from pipelines.package_model import GPU_TIMEOUT_S, MODEL_MOUNT

    p.add_argument(
        "--component-image",
        metavar="REF",
        help=f"image every step runs on, REPO:TAG or REPO@sha256:... (default: ${IMAGE_ENV}, else {COMPONENT_IMAGE})",
    )
    p.add_argument(
        "--gpu-component-image",
        metavar="REF",
        help=f"image of the cuda branch (default: ${GPU_IMAGE_ENV}, else the component image's tag + '-gpu')",
    )
    p.add_argument(
        "--model-pvc",
        metavar="CLAIM",
        help=f"mount this PersistentVolumeClaim at {MODEL_MOUNT} in the steps that read the model "
        f"(then --model {MODEL_MOUNT}/DIR)",
    )
    p.add_argument(
        "--gpu-timeout",
        type=int,
        default=GPU_TIMEOUT_S,
        metavar="SECONDS",
        help=f"activeDeadlineSeconds of the GPU steps' pods (default: {GPU_TIMEOUT_S})",
    )
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="compile every step with caching off (a run of an uploaded version cannot override it)",
    )


def _add_baseline(p: argparse.ArgumentParser) -> None:
    from pipelines.package_model import COMPATIBILITY_BUDGET

    p.add_argument(
        "--baseline-bundle",
        metavar="URI",
        help="text-embedding models: compare the new bundle with this one (a directory, or any URI ortpack-serve "
        "--bundle takes) as `ortpack bundle diff` does; the verdict goes into the report, verdict and metrics",
    )
    p.add_argument(
        "--require-compatible",
        action="store_true",
        help="with --baseline-bundle: ship nothing and fail the run unless the new bundle is a drop-in for it",
    )
    p.add_argument(
        "--compatibility-budget",
        type=float,
        metavar="F",
        help=f"with --baseline-bundle: the cross-space recall ratio a drop-in must reach (default: "
        f"{COMPATIBILITY_BUDGET})",
    )


def _add_publish(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--publish-to",
        metavar="URI",
        help="after the gate passed, push the bundle to oci://HOST/REPO[:TAG] (tag: the version) or upload "
        "it as a tar to s3://BUCKET/PREFIX/ (or minio://); prints the pinned URI",
    )


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, like every other error (`ortpack: error: ...`, exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from serving import __version__

    parser = _Parser(
        prog="ortpack",
        description="Turn a PyTorch model into a verified, hardware-optimized ONNX Runtime bundle.",
    )
    parser.add_argument("--version", action="version", version=f"ortpack {__version__}")
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
    p.add_argument("--sign-key", metavar="KEY.pem", help="sign the bundle with this EC private key (PEM)")
    p.add_argument(
        "--runner",
        choices=("subprocess", "docker"),
        default="subprocess",
        help="subprocess: every step in this environment (the default); docker: every step in the component "
        "image, through the Docker-API engine DOCKER_HOST names (Docker, or podman system service)",
    )
    p.add_argument(
        "--component-image",
        metavar="REF",
        help="with --runner docker: the image every step runs in (default: $ORTPACK_COMPONENT_IMAGE, else the "
        "image `make images` builds)",
    )
    _add_baseline(p)
    _add_publish(p)

    p = command("compile", cmd_compile, "compile the package_model pipeline to KFP YAML (byte-identical every time)")
    p.add_argument("--out", default="package_model.yaml", help="YAML file to write (default: package_model.yaml)")
    p.add_argument("--targets", default="cpu", help="targets the pipeline has branches for: cpu, cuda (default: cpu)")
    _add_graph(p)

    p = command("submit", cmd_submit, "upload the compiled pipeline and start a run on a Kubeflow Pipelines endpoint")
    p.add_argument("--host", required=True, help="Kubeflow Pipelines API endpoint, e.g. https://kfp.example.com")
    _add_model(p, required=False)
    _add_variants(p)
    _add_graph(p)
    _add_baseline(p)
    _add_publish(p)
    p.add_argument(
        "--params",
        metavar="FILE.yaml",
        help="pipeline parameters (a YAML mapping), applied over the values the options give",
    )
    p.add_argument("--wait", action="store_true", help="follow the run to its end; exit 0 if it succeeded, else 1")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="with --wait: terminate the run after this long")
    p.add_argument(
        "--poll", type=float, default=10.0, metavar="SECONDS", help="with --wait: poll interval (default: 10)"
    )
    p.add_argument("--service-account", help="Kubernetes service account the run's pods use")
    p.add_argument(
        "--pipeline-root",
        help=f"where the run's artifacts go (default: the backend's, usually {DEFAULT_PIPELINE_ROOT})",
    )
    p.add_argument("--pipeline-name", default="package-model", help="pipeline to upload to (default: package-model)")
    p.add_argument(
        "--secret",
        default="ortpack-credentials",
        help="Kubernetes secret with the model store's and registry's credentials, mounted (optional) into the "
        "steps that read the model, fetch the baseline bundle or publish (default: ortpack-credentials)",
    )
    p.add_argument(
        "--signing-secret",
        default="ortpack-signing-key",
        help="Kubernetes secret holding key.pem (and password) for --sign (default: ortpack-signing-key)",
    )
    p.add_argument("--sign", action="store_true", help="sign the bundle with the signing secret's key.pem")
    p.add_argument("--experiment", default="ortpack", help="experiment to add the run to (default: ortpack)")
    p.add_argument("--run-name", help="run name (default: '<name> <version>')")
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
    _add_int8_recipe(p)

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
    _add_version(p)
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    _add_bundle_commands(sub)
    return parser


def _add_bundle_commands(sub: Any) -> None:
    """`ortpack bundle ACTION`: one `action(...)` call per action, plus its own arguments."""
    what = "verify, check (here), diff, sign, push and pull bundles"
    bundle = sub.add_parser("bundle", help=what, description=f"{what}: ortpack bundle ACTION --help for each")
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

    where = "bundle directory (or its manifest.json)"
    p = action("verify", cmd_bundle_verify, "check a bundle's schema version, every file's sha256, and its signature")
    p.add_argument("bundle", help=where)
    trust_key(p, "fail")
    p.add_argument(
        "--require",
        action="append",
        default=None,
        metavar="EXPR",
        help="admission policy, repeatable, as ortpack-serve checks it: VARIANT_OR_PRECISION.METRIC OP NUMBER "
        "against the variant's recorded gate values (e.g. int8.min_cosine>=0.95) or space=ID; fail (exit 2) when "
        "no variant meets every expression that applies to it (also ORTPACK_REQUIRE, ';'-separated)",
    )

    p = action(
        "diff",
        cmd_bundle_diff,
        "will NEW break an index built with OLD? compare their embedding spaces: exit 0 drop-in, 3 re-index, "
        "4 incompatible",
    )
    p.add_argument("old", help="the bundle the index was built with: a directory or any URI ortpack-serve takes")
    p.add_argument("new", help="the candidate bundle: a directory or any URI ortpack-serve takes")
    p.add_argument(
        "--budget",
        type=float,
        default=0.95,
        help="drop-in when new queries searching old documents find at least this share of the old bundle's own "
        "top-10 (default: 0.95)",
    )
    p.add_argument(
        "--all-pairs",
        action="store_true",
        help="compare every OLD variant with every NEW one (default: the pairs of the same precision)",
    )
    p.add_argument("--json", action="store_true", help="print the whole result as JSON instead of a table")
    p.add_argument(
        "--queries",
        metavar="FILE",
        help="retrieval queries, one per line (or .jsonl strings) (default: 400 shipped support-desk questions)",
    )
    p.add_argument(
        "--documents",
        metavar="FILE",
        help="retrieval documents, one per line (or .jsonl strings) (default: the shipped validation sentences)",
    )
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (default: 0, every core)")

    p = action(
        "check",
        cmd_bundle_check,
        "replay the bundle's probe set through a variant on this machine and apply its gate (exit 1 on a miss)",
    )
    p.add_argument("bundle", help=where)
    p.add_argument(
        "--variant",
        default="auto",
        metavar="ID|auto",
        help="the variant to replay the probe set through: one of the bundle's variant ids (e.g. cpu-int8; "
        "`ortpack bundle verify` lists them), or auto (the default): the one a server on this machine would "
        "pick, falling back to the next as a server would when it misses",
    )
    trust_key(p, "fail")

    p = action("sign", cmd_bundle_sign, "sign every file of a bundle (OpenSSF model signing) into BUNDLE/model.sig")
    p.add_argument("bundle", help="bundle directory or its manifest.json (verified before signing)")
    p.add_argument("--key", required=True, metavar="KEY.pem", help="EC private key (PEM; P-256, P-384 or P-521)")
    p.add_argument(
        "--key-password-env",
        metavar="VAR",
        help="environment variable holding the private key's password, if it is encrypted",
    )

    p = action("push", cmd_bundle_push, "push a bundle to an OCI registry; print its pinned oci://...@sha256: URI")
    p.add_argument("bundle", help="bundle directory or its manifest.json (verified before pushing)")
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO:TAG", help="where to push")
    p.add_argument(
        "--modelcar",
        action="store_true",
        help="push a container image with the bundle under /models (KServe modelcar, storageUri: oci://...) "
        "instead of an ortpack bundle artifact",
    )
    p.add_argument(
        "--modelcar-base",
        metavar="oci://REF",
        help="with --modelcar: an image with a shell (busybox) whose layers go first; KServe's modelcar "
        "sidecar runs `sh -c ...` in it",
    )
    trust_key(p, "refuse to push")

    p = action("pull", cmd_bundle_pull, "pull a bundle from an OCI registry, check every digest, and verify it")
    p.add_argument("reference", metavar="oci://HOST[:PORT]/REPO@sha256:...|:TAG", help="what to pull")
    p.add_argument("--out", required=True, help="bundle directory to create (must not exist)")
    trust_key(p, "fail (and remove --out)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(-args.quiet + args.verbose, args.debug)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return int(args.func(args))
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        print("ortpack: interrupted", file=sys.stderr)
        return 128 + int(signum)
    except Exception as exc:  # noqa: BLE001 - every error ends as one line and an exit code
        if args.debug:
            import traceback

            traceback.print_exc()
        return _report(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM cleans up like SIGINT: stop the step subprocesses we started (kfp.local's), then
    unwind through every `finally` (temporary directories are removed) and exit 143."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.send_signal(signal.SIGINT)
    except ImportError:
        pass
    raise KeyboardInterrupt(signum)


def _report(exc: Exception) -> int:
    from components.core.errors import OrtpackError, ParityError

    message = one_line(exc)
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
