"""The pipeline commands: `run` (the package_model pipeline on this machine, kfp.local),
`compile` (its KFP YAML) and `submit` (a run on a Kubeflow Pipelines endpoint), with their flags.
Their arguments are built and checked in pipeline_arguments.py."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from ortpack.components.container_images import (
    COMPONENT_IMAGE,
    IMAGE_ENV,
    STEPS_IMAGE_ENV,
    check_image,
    steps_image_for,
)
from ortpack.components.core.errors import InvalidSpecError, one_line
from ortpack.components.core.report import format_summary
from ortpack.components.core.specs import get_target
from ortpack.kernel.contracts import get_contract
from ortpack.pipelines.cli.common import EXIT_GATE, log
from ortpack.pipelines.cli.options import (
    add_baseline,
    add_command,
    add_graph,
    add_model,
    add_publish,
    add_variants,
    csv_list,
)
from ortpack.pipelines.cli.pipeline_arguments import checked_spec, graph_options, pipeline_arguments
from ortpack.pipelines.golden import compile_pipeline, pipeline_parameters
from ortpack.pipelines.local import (
    docker_runner,
    load_run_records,
    published_uri,
    remove_run_containers,
    run_pipeline_locally,
    run_verdict,
    stage_local_inputs,
)
from ortpack.pipelines.submit import find_bundle, follow_run, pinned_publish_uri, submit_run

DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # ortpack.pipelines.submit.DEFAULT_PIPELINE_ROOT


def add_commands(sub: Any) -> None:
    """`run`, `compile` and `submit`, in this order in `ortpack --help`."""
    p = add_command(sub, "run", cmd_run, "run the package_model Kubeflow pipeline on this machine (kfp.local)")
    add_model(p, required=False)
    add_variants(p)
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
        help="with --runner docker: the image resolve and export run in (default: $ORTPACK_COMPONENT_IMAGE, else "
        "the image `make images` builds)",
    )
    p.add_argument(
        "--steps-image",
        metavar="REF",
        help="with --runner docker: the image of the steps that need no PyTorch (default: $ORTPACK_STEPS_IMAGE, "
        "else ortpack-steps beside an ortpack-component tag, else the component image)",
    )
    add_baseline(p)
    add_publish(p)

    p = add_command(
        sub, "compile", cmd_compile, "compile the package_model pipeline to KFP YAML (byte-identical every time)"
    )
    p.add_argument("--out", default="package_model.yaml", help="YAML file to write (default: package_model.yaml)")
    p.add_argument("--targets", default="cpu", help="targets the pipeline has branches for: cpu, cuda (default: cpu)")
    add_graph(p)

    p = add_command(
        sub, "submit", cmd_submit, "upload the compiled pipeline and start a run on a Kubeflow Pipelines endpoint"
    )
    p.add_argument("--host", required=True, help="Kubeflow Pipelines API endpoint, e.g. https://kfp.example.com")
    add_model(p, required=False)
    add_variants(p)
    add_graph(p)
    add_baseline(p)
    add_publish(p)
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


def _print_published(run_dir: Path) -> None:

    uri = published_uri(run_dir)
    if uri:
        print(f"published: {uri}")


def _print_compatibility(run_dir: Path) -> None:
    """The verdict against the baseline bundle, in one line, when the run compared with one."""

    verdict = run_verdict(run_dir)
    if verdict is not None and verdict.compatibility:
        print(f"compatibility: {verdict.compatibility['summary']}")


def cmd_run(args: argparse.Namespace) -> int:

    targets, arguments, name = pipeline_arguments(args, local=True)  # before kfp's import: refusals are quick
    from ortpack.pipelines.package_model import make_pipeline

    run_id = uuid.uuid4().hex[:12]
    if args.sign_key:
        key = Path(args.sign_key).expanduser()
        if not key.is_file():
            raise InvalidSpecError(f"signing key not found: {args.sign_key}")
        arguments["sign_key"] = str(key.resolve())
    out = Path(args.out or Path("dist") / name)
    if out.exists() and not args.force:
        raise InvalidSpecError(f"output directory exists: {out} (use --force to replace it, or --out)")
    runner, image, steps_image = None, None, None
    if args.runner == "docker":
        try:
            image = check_image(args.component_image or os.environ.get(IMAGE_ENV) or COMPONENT_IMAGE)
            steps_image = check_image(args.steps_image or os.environ.get(STEPS_IMAGE_ENV) or steps_image_for(image))
        except ValueError as exc:
            raise InvalidSpecError(str(exc)) from None
        runner = docker_runner([image, steps_image], run_id)
        root = Path(args.pipeline_root)
        arguments = stage_local_inputs(arguments, ("model_uri", "sign_key", "baseline_bundle"), root)
        kind = get_contract(str(arguments["task"])).options
        arguments["task_options"] = stage_local_inputs(
            arguments["task_options"], (*kind.FILES, *kind.DIRECTORIES), root
        )
    log.info(
        "running the %s pipeline locally (kfp.local, %s) for %s %s: %s",
        "package-model",
        f"resolve and export in {image}, the other steps in {steps_image}" if image else "steps as subprocesses here",
        name,
        arguments["version"],
        ", ".join(f"{t} {'/'.join(arguments[f'{t}_precisions'])}" for t in targets),
    )
    try:
        result = run_pipeline_locally(
            make_pipeline(targets, parallelism=1, image=image, steps_image=steps_image),
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
            remove_run_containers(run_id)
    export, records = load_run_records(result.run_dir)
    print(format_summary(export, records))
    print(f"bundle: {out} ({', '.join(r.variant_id for r in records if r.passed)}), report: {out / 'report.html'}")
    _print_compatibility(result.run_dir)
    _print_published(result.run_dir)
    print(f"run: {result.run_dir} (log: {result.log_file})")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:

    targets = csv_list(args.targets)
    for t in targets:
        get_target(t)
    compile_pipeline(Path(args.out), graph_options(args, targets))
    print(args.out)
    return 0


def _read_params(path: str) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidSpecError(f"cannot read --params {path}: {one_line(exc, 200)}") from None
    if not isinstance(loaded, dict):
        raise InvalidSpecError(f"--params {path} must be a mapping of pipeline parameters")
    return loaded


def cmd_submit(args: argparse.Namespace) -> int:
    import tempfile

    targets, arguments, name = pipeline_arguments(args, local=False)  # before kfp's import: refusals are quick
    options = graph_options(args, targets)
    from ortpack.pipelines.package_model import PIPELINE_NAME, SIGNING_KEY

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
        checked_spec(  # the arguments as submitted, --params included
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
