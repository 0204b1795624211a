"""Pipeline-side task families: one module per task owns what differs between tasks.

A `TaskFamily` holds its exporter, its I/O contract (the signature check of a built graph), how
its outputs are compared with PyTorch and the default gates, benchmark inputs, its int8 recipe,
its transformer fusions (if any), its probe set and its report columns. The steps (export,
optimize, validate, benchmark, package, report) ask the family and never compare task names.
Adding a task is five modules (its contract and engine in the kernel, its family and exporter
here, its serving plugin) and one registry line per side (kernel/contracts/__init__.py and
`FAMILIES` below), with their tests (docs/architecture.md).

Families are registered explicitly in `FAMILIES` (no import side effects). Modules here import
only numpy and the library at import time; torch and onnxruntime load inside functions, so the
registry is cheap to consult (the CLI validates options with it before any heavy work).

The checks of a spec that need the family live here too (`check_export_spec`, `check_build_spec`,
`thresholds_for`): ortpack.components.core.specs does not import the registry. A task's options are
its contract's (kernel/contracts/<task>.py: `ExportSpec` checks them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortpack.components.core.errors import InvalidSpecError, did_you_mean
from ortpack.components.core.specs import unknown_task
from ortpack.components.core.tasks import (
    automatic_speech_recognition,
    image_classification,
    image_embedding,
    object_detection,
    semantic_segmentation,
    text_classification,
    text_embedding,
    text_generation,
    token_classification,
)
from ortpack.components.core.tasks.family import TaskFamily

if TYPE_CHECKING:
    from ortpack.components.core.specs import BuildSpec, ExportSpec, ParityThresholds


# The registered families, one line each: components/core/tasks/<module>.py's FAMILY (imported here,
# so a reader and tests/test_import_boundary.py see every task's edges)
FAMILIES: dict[str, TaskFamily] = {
    family.name: family
    for family in (
        text_embedding.FAMILY,
        image_classification.FAMILY,
        text_classification.FAMILY,
        token_classification.FAMILY,
        object_detection.FAMILY,
        image_embedding.FAMILY,
        semantic_segmentation.FAMILY,
        text_generation.FAMILY,
        automatic_speech_recognition.FAMILY,
    )
}


def _registry() -> dict[str, TaskFamily]:
    return FAMILIES


def get_family(task: str) -> TaskFamily:
    families = _registry()
    try:
        return families[task]
    except KeyError:
        raise InvalidSpecError(unknown_task(task)) from None  # the registries name the same tasks


def task_names() -> tuple[str, ...]:
    return tuple(_registry())


def resolve_model_source(value: str, task: str) -> tuple[str, str]:
    """Return `(source, default_name)` for `value` as the task's family understands it."""
    return get_family(task).resolve_source(value)


def check_int8_recipe(task: str, recipe: str | None) -> None:
    """Refuse a pinned int8 recipe the task does not have, naming the ones it has."""
    if not recipe:
        return
    known = get_family(task).int8_recipes
    if recipe not in known:
        names = ", ".join(known) if known else "none"
        raise InvalidSpecError(
            f"unknown int8 recipe {recipe!r} for task {task!r} (known: {names}){did_you_mean(recipe, known)}"
        )


def check_export_spec(spec: ExportSpec) -> None:
    """What an ExportSpec cannot check alone: a family builds its task (the spec itself checked
    the task's contract and options)."""
    get_family(spec.task)


def default_thresholds(task: str, precision: str) -> ParityThresholds:
    """The task family's default gate for a precision (a precision the task does not build is
    refused: int4 is weight-only quantization for decoders)."""
    family = get_family(task)
    if precision not in family.thresholds:
        raise InvalidSpecError(f"task {task!r} has no {precision} variant (it builds {', '.join(family.thresholds)})")
    return family.thresholds[precision]


def thresholds_for(task: str, precision: str, overrides: dict[str, dict[str, float]] | None = None) -> ParityThresholds:
    """Default thresholds for a task and precision with user overrides applied and checked."""
    base = default_thresholds(task, precision)
    merged: dict[str, float | None] = {}
    for scope in ("*", precision):
        merged.update((overrides or {}).get(scope, {}))
    return base.updated(**merged)


def check_build_spec(spec: BuildSpec) -> None:
    """What a BuildSpec cannot check alone: its export (`check_export_spec`), its pinned int8
    recipe, and every variant's gate with the overrides applied (fail now, not after the export)."""
    check_export_spec(spec.export)
    check_int8_recipe(spec.export.task, spec.int8_recipe)
    for v in spec.variants:
        thresholds_for(spec.export.task, v.precision, spec.threshold_overrides)
