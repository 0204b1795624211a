"""The exporter registry: one exporter per task, registered under a string key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from components.core.errors import InvalidSpecError

if TYPE_CHECKING:
    from components.core.artifacts import ExportResult
    from components.core.specs import ExportSpec

Exporter = Callable[["ExportSpec", Path], "ExportResult"]

_EXPORTERS: dict[str, Exporter] = {}


def register_exporter(task: str) -> Callable[[Exporter], Exporter]:
    """Register `fn` as the exporter for `task` (one exporter per task)."""

    def decorate(fn: Exporter) -> Exporter:
        if task in _EXPORTERS:
            raise RuntimeError(f"two exporters registered for task {task!r}")
        _EXPORTERS[task] = fn
        return fn

    return decorate


def get_exporter(task: str) -> Exporter:
    try:
        return _EXPORTERS[task]
    except KeyError:
        raise InvalidSpecError(f"no exporter for task {task!r} (known: {', '.join(sorted(_EXPORTERS))})") from None


def registered_tasks() -> list[str]:
    return sorted(_EXPORTERS)
