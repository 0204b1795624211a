"""The options commands share: the flag groups (`add_model`, `add_variants`, ...) and what their
values mean (`export_spec`, `model_parameters`, `threshold_overrides`, `csv_list`).

Everything heavy is imported inside the functions: the command line starts fast, and
`ortpack compile` never imports torch or onnxruntime."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ortpack.components.container_images import COMPONENT_IMAGE, GPU_IMAGE_ENV, IMAGE_ENV, STEPS_IMAGE_ENV
from ortpack.components.core.build import export_parameters, export_spec_from_parameters
from ortpack.components.core.errors import InvalidSpecError
from ortpack.components.core.sources import check_local_file
from ortpack.components.core.specs import parse_threshold_overrides
from ortpack.components.core.tasks import resolve_model_source
from ortpack.kernel.contracts import DEFAULT_TASK, contract_names, get_contract
from ortpack.pipelines.defaults import COMPATIBILITY_BUDGET, GPU_TIMEOUT_S, MODEL_MOUNT

Command = Callable[[argparse.Namespace], int]  # a command's function: its exit code


def add_command(sub: Any, name: str, fn: Command, help_: str) -> argparse.ArgumentParser:
    """A command (or a `bundle` action) of the subparsers `sub`, with the options every command has."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
    p.set_defaults(func=fn)
    add_common(p)
    return p


# ---------------------------------------------------------------------------- values


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


def model_parameters(args: argparse.Namespace, *, local: bool = True) -> dict[str, Any]:
    """The export parameters of a command's model options (ortpack.components.core.build: one mapping
    from options to specs, shared with the pipeline's export step). `local`: directories of photos
    must exist here, and are named by absolute path (steps may run in another directory)."""

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

    params = model_parameters(args)
    options = params["task_options"]
    for key in get_contract(args.task).options.FILES:  # weights, labels: files on this machine
        if options.get(key):
            options[key] = check_local_file(options[key], key)
    source, default_name = resolve_model_source(args.model, args.task)
    return export_spec_from_parameters(params, source=source, default_name=default_name)


def csv_list(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items


def threshold_overrides(args: argparse.Namespace) -> dict[str, dict[str, float]]:

    return parse_threshold_overrides(args.threshold)


# ---------------------------------------------------------------------------- flag groups


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="count", default=0, help="print only warnings and the result")
    p.add_argument("-v", "--verbose", action="count", default=0, help="print debug progress")
    p.add_argument(
        "--debug",
        action="store_true",
        default=bool(os.environ.get("ORTPACK_DEBUG")),
        help="show library warnings and full tracebacks (also ORTPACK_DEBUG=1)",
    )


def add_model(p: argparse.ArgumentParser, required: bool = True) -> None:

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
            "(default: all-MiniLM-L6-v2); image models: any torchvision classifier or detector name, timm:NAME, "
            "a Hugging Face image-classifier directory, PACKAGE.MODULE:FACTORY or FILE.pt2",
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
    p.add_argument(
        "--resize-size", type=int, help="image models: shorter side after resize (default: the weights' or config's)"
    )
    p.add_argument("--crop-size", type=int, help="image models: centre crop size (default: the weights' or config's)")
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
        help="any option of the task, by its name in the task's contract (kernel/contracts/<task>.py), "
        "e.g. max_length=128; VALUE is read as JSON when it parses (repeatable)",
    )
    p.add_argument(
        "--allow-degenerate-reference",
        action="store_true",
        help="build even when the PyTorch outputs barely vary across inputs (random weights): every parity "
        "check is then vacuous, and the report says so",
    )


def add_variants(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", default="cpu", help="comma-separated target presets: cpu, cuda (default: cpu)")
    p.add_argument(
        "--precisions",
        default="fp32,int8",
        help="comma-separated precisions: fp32, int8, int4 (cpu; int4: text-generation only), fp16 (cuda) "
        "(default: fp32,int8)",
    )
    add_version(p)
    add_thresholds(p)
    add_off_target(p)
    add_int8_recipe(p)


def add_int8_recipe(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--int8-recipe",
        metavar="NAME",
        help="build int8 with this recipe instead of searching (text: per-channel, per-tensor, ffn-out-fp32, "
        "each also NAME+int8-embeddings; images: s8, s7, s8-uncorrected, s7-uncorrected), e.g. the one a bundle's "
        "optimize record names, to keep its embedding space",
    )


def add_version(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--version",
        help="bundle version written to the manifest (default: unique per run: UTC time and a run hash, "
        "e.g. 20261130.101500-1a2b3c4d)",
    )


def add_off_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-off-target-validation",
        action="store_true",
        help="ship a variant validated on another execution provider than its target's (a cuda variant "
        "checked on the CPU provider because this onnxruntime has no CUDA); the report marks it",
    )


def add_thresholds(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[PRECISION.]NAME=VALUE",
        help="override a parity threshold, e.g. int8.min_neighbour_agreement=0.9 or max_abs_diff=1e-5 "
        f"(each task gates its own: {'; '.join(_threshold_names())}); repeatable",
    )


def _threshold_names() -> list[str]:
    """Every task's threshold names (kernel/contracts/<task>.py), as `task: a, b`."""

    return [f"{task}: {' '.join(get_contract(task).gates)}" for task in contract_names()]


def add_graph(p: argparse.ArgumentParser) -> None:
    """Options that shape the compiled YAML (`compile` and `submit` share them)."""

    p.add_argument(
        "--component-image",
        metavar="REF",
        help=f"image of resolve and export (PyTorch), REPO:TAG or REPO@sha256:... (default: ${IMAGE_ENV}, "
        f"else {COMPONENT_IMAGE})",
    )
    p.add_argument(
        "--steps-image",
        metavar="REF",
        help=f"image of the steps that need no PyTorch (default: ${STEPS_IMAGE_ENV}, else ortpack-steps beside an "
        "ortpack-component tag, else the component image)",
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


def add_baseline(p: argparse.ArgumentParser) -> None:

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


def add_publish(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--publish-to",
        metavar="URI",
        help="after the gate passed, push the bundle to oci://HOST/REPO[:TAG] (tag: the version) or upload "
        "it as a tar to s3://BUCKET/PREFIX/ (or minio://); prints the pinned URI",
    )
