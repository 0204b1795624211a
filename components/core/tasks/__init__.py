"""Pipeline-side task families: one module per task owns what differs between tasks.

A `TaskFamily` holds its exporter, its I/O contract (the signature check of a built graph), how
its outputs are compared with PyTorch and the default gates, benchmark inputs, its int8 recipe,
its transformer fusions (if any), its probe set and its report columns. The steps (export,
optimize, validate, benchmark, package, report) ask the family and never compare task names.
Adding a task is one module here, one in serving/tasks/, and their tests.

Families are registered explicitly in `_registry` (no import side effects). Modules here import
only numpy and the library at import time; torch and onnxruntime load inside functions, so the
registry is cheap to consult (the CLI validates options with it before any heavy work).

The checks of a spec that need the family live here too (`check_export_spec`, `check_build_spec`,
`thresholds_for`): components.core.specs does not import the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from functools import cache
from importlib import import_module
from typing import TYPE_CHECKING

from components.core.errors import InvalidSpecError, and_list, did_you_mean
from components.core.specs import TASK_OPTIONS
from components.core.tasks.family import TaskFamily

if TYPE_CHECKING:
    from components.core.specs import BuildSpec, ExportSpec, ParityThresholds


# The registered families: each is components/core/tasks/<module>.py, whose FAMILY it is
FAMILY_MODULES = (
    "text_embedding",
    "image_classification",
    "text_classification",
    "token_classification",
)


@cache
def _registry() -> dict[str, TaskFamily]:
    families = [import_module(f"components.core.tasks.{module}").FAMILY for module in FAMILY_MODULES]
    return {f.name: f for f in families}


def get_family(task: str) -> TaskFamily:
    families = _registry()
    try:
        return families[task]
    except KeyError:
        raise InvalidSpecError(
            f"unknown task {task!r} (known: {', '.join(families)}){did_you_mean(task, families)}"
        ) from None


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


def check_task_options(task: str, given: Iterable[str]) -> None:
    """Refuse an unknown task (naming the known ones), then the ExportSpec options in `given`
    (field names, in field order) that the task does not read."""
    family = get_family(task)  # an unknown task fails here, naming the known ones
    foreign = [name for name in given if name not in family.options]
    if foreign:
        flags = and_list(["--" + name.replace("_", "-") for name in foreign])
        verb = "does" if len(foreign) == 1 else "do"
        raise InvalidSpecError(f"{flags} {verb} not apply to task {task!r}")


def check_export_spec(spec: ExportSpec) -> None:
    """What an ExportSpec cannot check alone: its task is known and reads every option given."""
    check_task_options(
        spec.task, [f.name for f in fields(spec) if f.name in TASK_OPTIONS and getattr(spec, f.name) is not None]
    )


def default_thresholds(task: str, precision: str) -> ParityThresholds:
    """The task family's default gate for a precision."""
    return get_family(task).thresholds[precision]


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
