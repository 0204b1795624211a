"""The package_model pipeline's arguments from the options of `run` and `submit`, checked as the
steps will read them before any step runs; and the compiled graph's shape (`compile`, `submit`)."""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortpack.components.container_images import GPU_IMAGE_ENV, IMAGE_ENV, STEPS_IMAGE_ENV, check_image, gpu_image_for
from ortpack.components.core.build import export_spec_from_parameters, pipeline_parameters, resolve_version
from ortpack.components.core.errors import InvalidSpecError
from ortpack.components.core.sources import check_local_file, check_uri, default_name, is_remote, uri_scheme
from ortpack.components.core.specs import BuildSpec, variant_grid
from ortpack.components.core.tasks import check_build_spec, resolve_model_source
from ortpack.kernel.bundle import MANIFEST_NAME, read_manifest
from ortpack.kernel.contracts import get_contract, space_tasks
from ortpack.kernel.oci import OciReference
from ortpack.pipelines.cli.options import csv_list, model_parameters, threshold_overrides
from ortpack.pipelines.defaults import COMPATIBILITY_BUDGET
from ortpack.pipelines.golden import GraphOptions

if TYPE_CHECKING:
    from ortpack.components.core.specs import BuildSpec


def pipeline_arguments(args: argparse.Namespace, *, local: bool) -> tuple[list[str], dict[str, Any], str]:
    """Validate the pipeline options before anything heavy; return (targets, arguments, name).

    A model URI is checked for form here and fetched by the export step. `local` (`run`) checks
    that a model path and --weights/--labels paths exist here; a submitted run reads them in the
    cluster's component image (or a mounted volume) instead."""

    model = args.model.strip()
    if not model:
        raise InvalidSpecError("--model is empty")
    params = model_parameters(args, local=local)
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
        thresholds=threshold_overrides(args),
        version=resolve_version(args.version or "", uuid.uuid4().hex),
        allow_off_target_validation=args.allow_off_target_validation,
        int8_recipe=(args.int8_recipe or "").strip(),
        publish_to=(args.publish_to or "").strip(),
        **_baseline_parameters(args, local=local),
    )
    spec = checked_spec(
        arguments,
        source=source,
        default_name=name,
        targets=csv_list(args.targets),
        precisions=csv_list(args.precisions),
    )
    return targets_of(spec), arguments, spec.export.name


def _baseline_parameters(args: argparse.Namespace, *, local: bool) -> dict[str, Any]:
    """The baseline comparison's pipeline parameters. `local` (`run`): a path must name a bundle
    here (a directory, its manifest.json, or a .tar), and is passed by absolute path; a directory
    must hold a text-embedding bundle. `submit` passes a path as is (the package step reads it)."""

    baseline = (args.baseline_bundle or "").strip()
    if not baseline and (args.require_compatible or args.compatibility_budget is not None):
        given = "--require-compatible" if args.require_compatible else "--compatibility-budget"
        raise InvalidSpecError(f"{given} applies only with --baseline-bundle")
    if baseline and local and "://" not in baseline:
        path = Path(baseline).expanduser()
        path = path.parent if path.name == MANIFEST_NAME else path
        if not path.exists():
            raise InvalidSpecError(f"--baseline-bundle: no bundle at {baseline}")
        if path.is_dir():
            manifest = read_manifest(path)
            if get_contract(manifest.task).space is None:
                raise InvalidSpecError(
                    f"--baseline-bundle: {baseline} is a {manifest.task} bundle; only embedding bundles "
                    f"({', '.join(space_tasks())}) are compared (as `ortpack bundle diff` does)"
                )
        baseline = str(path.resolve())  # steps may run in another directory
    budget = args.compatibility_budget
    return {
        "baseline_bundle": baseline,
        "require_compatible": bool(args.require_compatible),
        "compatibility_budget": COMPATIBILITY_BUDGET if budget is None else float(budget),
    }


# the schemes ortpack.kernel.sources fetches a bundle from (with plain paths)
BUNDLE_SCHEMES = ("file", "http", "https", "s3", "minio", "oci")


def _validate_baseline(arguments: dict[str, Any]) -> None:
    """Refuse a baseline comparison the package step could not make, before any step runs."""

    baseline = str(arguments.get("baseline_bundle") or "")
    if not baseline:
        if arguments.get("require_compatible"):
            raise InvalidSpecError("require_compatible needs a baseline bundle (--baseline-bundle URI)")
        return

    task = str(arguments.get("task"))
    if get_contract(task).space is None:
        raise InvalidSpecError(
            f"--baseline-bundle compares embedding bundles ({', '.join(space_tasks())}), as `ortpack bundle diff` "
            "does; this run "
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


def checked_spec(
    arguments: dict[str, Any], *, source: str, default_name: str, targets: list[str], precisions: list[str]
) -> BuildSpec:
    """The one BuildSpec these pipeline arguments describe, checked as the steps will read it (the
    export spec, every variant's gate, the baseline comparison, the publish destination).
    `arguments` are rewritten from it (`pipeline_parameters`: the name filled in, each target's
    precisions), so the steps read exactly the spec that was checked."""

    spec = BuildSpec(
        export=export_spec_from_parameters(arguments, source=source, default_name=default_name),
        variants=tuple(variant_grid(targets, precisions)),
        threshold_overrides=arguments.get("thresholds") or {},
        version=str(arguments["version"]),
        allow_off_target_validation=bool(arguments.get("allow_off_target_validation", False)),
        int8_recipe=arguments.get("int8_recipe") or None,
    )
    check_build_spec(spec)
    arguments.update(pipeline_parameters(spec))
    _validate_baseline(arguments)
    publish_to = arguments.get("publish_to") or ""
    if publish_to:
        scheme = uri_scheme(publish_to)
        if scheme not in ("oci", "s3", "minio"):
            raise InvalidSpecError(
                f"--publish-to takes oci://HOST/REPO[:TAG] or s3://BUCKET/PREFIX/ (or minio://): {publish_to}"
            )
        if scheme == "oci":
            ref = OciReference.parse(publish_to)
            if ref.digest:
                raise InvalidSpecError(f"--publish-to names a digest; give a repository or a tag: {publish_to}")
            if not ref.tag:
                OciReference.parse(f"{publish_to}:{arguments['version']}")  # the version must be a valid tag
    return spec


def targets_of(spec: BuildSpec) -> list[str]:
    """The targets that have a variant in `spec`, in order (a pipeline branch each)."""
    return list(dict.fromkeys(v.target for v in spec.variants))


def graph_options(args: argparse.Namespace, targets: list[str]) -> Any:
    """What shapes the compiled YAML, from the options (and ORTPACK_COMPONENT_IMAGE, ORTPACK_STEPS_IMAGE,
    ORTPACK_GPU_COMPONENT_IMAGE): `compile` and `submit` build the same YAML from the same options."""

    image = args.component_image or os.environ.get(IMAGE_ENV) or None
    steps_image = args.steps_image or os.environ.get(STEPS_IMAGE_ENV) or None
    gpu_image = args.gpu_component_image or os.environ.get(GPU_IMAGE_ENV) or None
    try:
        image = check_image(image) if image else None
        steps_image = check_image(steps_image) if steps_image else None
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
        steps_image=steps_image,
        model_pvc=args.model_pvc or None,
        gpu_timeout_s=args.gpu_timeout,
        cache=not args.no_cache,
    )
