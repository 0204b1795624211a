"""Each task's engine (`<task>.py`, named by its contract), and how to open one.

An engine module exports `ENGINE` (ortpack.kernel.engine.EngineSpec); `tokens.py` and `images.py`
hold what the text tasks and the image tasks share. A module is imported when its task is run,
never by reading a manifest.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ortpack.kernel.contracts import get_contract
from ortpack.kernel.engine import Engine, EngineContext, EngineOptions, EngineSpec

if TYPE_CHECKING:
    from ortpack.kernel.bundle import Manifest, Variant


def get_engine(task: str) -> EngineSpec:
    """The engine of a registered task (UnknownTaskError, a ValueError, for another)."""
    module = get_contract(task).engine
    spec = import_module(module).ENGINE
    if not isinstance(spec, EngineSpec) or spec.name != task:
        raise TypeError(f"{module}.ENGINE must be the EngineSpec of {task!r}")
    return spec


def open_engine(
    manifest: Manifest,
    session: Any,
    files: Mapping[str, bytes],
    *,
    variant: Variant | None = None,
    options: EngineOptions | None = None,
) -> Engine:
    """The engine of a bundle's task on `session` (the bundle's shared files verified by the caller)."""
    context = EngineContext.of(manifest, session, files, variant=variant, options=options)
    return get_engine(manifest.task).open(context)
