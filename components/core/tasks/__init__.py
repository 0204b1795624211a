"""Pipeline-side task families: one module per task owns what differs between tasks.

A `TaskFamily` holds its exporter, its I/O contract (the signature check of a built graph), how
its outputs are compared with PyTorch and the default gates, benchmark inputs, its int8 recipe,
its transformer fusions (if any), its probe set and its report columns. The steps (export,
optimize, validate, benchmark, package, report) ask the family and never compare task names.
Adding a task is one module here, one in serving/tasks/, and their tests.

Families are registered explicitly in `_registry` (no import side effects). Modules here import
only numpy and the library at import time; torch and onnxruntime load inside functions, so the
registry is cheap to consult (the CLI validates options with it before any heavy work).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.core.errors import InvalidSpecError, did_you_mean

if TYPE_CHECKING:
    import numpy as np

    from components.core.artifacts import ExportResult
    from components.core.specs import ExportSpec, ParityThresholds
    from serving.probe import Probe


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A variant's outputs against PyTorch's on the validation set: every number, per-item
    distances for the report, how many samples, and misses that are not thresholds (NaN rows)."""

    values: dict[str, float]
    per_item: dict[str, list[float]]
    samples: int
    misses: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ReportSpec:
    """How the report shows a task: summary columns (header, metric, format), the per-item
    distance plot (per_item key, axis label, how the gate's threshold maps onto that axis) and
    the agreement plot (per_item key, k, axis label)."""

    columns: tuple[tuple[str, str, str], ...]
    distance: tuple[str, str, Callable[[dict[str, float]], float | None]]
    agreement: tuple[str, int, str]
    unit: str  # "sentences", "images", ...


@dataclass(frozen=True, kw_only=True)
class TaskFamily:
    name: str
    description: str
    # ExportSpec fields this task reads beyond source/name/opset: options it does not read are refused
    options: frozenset[str]
    resolve_source: Callable[[str], tuple[str, str]]  # user's --model -> (source, default bundle name)
    export: Callable[[ExportSpec, Path], ExportResult]
    thresholds: dict[str, ParityThresholds]  # default gate per precision
    check_signature: Callable[[Any], list[str]]  # an ORT session's inputs/outputs against the contract
    compare: Callable[[Any, Any, Path], Comparison]  # (session, reference npz, export dir)
    bench_feeds: Callable[[ExportResult], dict[str, tuple[int, dict[str, np.ndarray]]]]
    # (fused fp32 graph, int8 graph to write, export, export dir, pinned recipe or None): the int8
    # recipe, which may read the export (its model_type, its calibration data); may return what it
    # chose and measured (the optimize step's `int8` metrics)
    quantize_int8: Callable[[Path, Path, ExportResult, Path, str | None], dict[str, Any] | None]
    select_probe: Callable[[ExportResult, Path], Probe]
    report: ReportSpec
    # transformer fusions before the precision conversion:
    # (raw path, export, gpu) -> (OnnxModel, fused operator counts, the fuser that ran)
    fuse: Callable[[Path, ExportResult, bool], tuple[Any, dict[str, int], str]] | None = None
    # the int8 recipes a build may pin by name (components/core/recipes.py; empty: none)
    int8_recipes: tuple[str, ...] = ()
    # its outputs are vectors an index stores: `ortpack bundle diff` and the pipeline's baseline
    # check (components/core/compat.py) apply
    embedding_space: bool = False


@cache
def _registry() -> dict[str, TaskFamily]:
    from components.core.tasks import image_classification, text_classification, text_embedding

    families = (text_embedding.FAMILY, image_classification.FAMILY, text_classification.FAMILY)
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
