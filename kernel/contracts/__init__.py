"""Task contracts: for each task, one torch-free module (kernel/contracts/<task>.py) that owns
its data: the manifest section it writes and reads, the numbers that gate it and which serving
plugin serves it. The bundle's Manifest is a union of the registered sections keyed by task, the
gate is each task's own table, and the server finds a task's plugin here.

Contracts are registered in `_registry` below (explicitly: no import side effects). The pipeline's
side of a task (its exporter, comparison, int8 recipes) is its family in components/core/tasks/.
"""

from __future__ import annotations

from functools import cache
from importlib import import_module
from typing import Annotated, Any, Union

from pydantic import Field

from ortpack.kernel.contracts.base import (
    TaskContract,
    TaskOptions,
    TaskSettings,
    TextOptions,
    TextSettings,
    TokenizerSettings,
)

__all__ = [
    "DEFAULT_TASK",
    "TaskContract",
    "TaskOptions",
    "TaskSettings",
    "TextOptions",
    "TextSettings",
    "TokenizerSettings",
    "UnknownTaskError",
    "contract_names",
    "get_contract",
    "settings_union",
    "space_tasks",
]


# The task a build, the CLI and the pipeline assume when none is named
DEFAULT_TASK = "text-embedding"


class UnknownTaskError(ValueError):
    """A task name no contract is registered for."""


# The registered tasks: each is kernel/contracts/<module>.py, whose CONTRACT it is (in this order)
TASK_MODULES = (
    "text_embedding",
    "image_classification",
    "text_classification",
    "token_classification",
    "object_detection",
    "image_embedding",
)


@cache
def _registry() -> dict[str, TaskContract]:
    contracts = [import_module(f"ortpack.kernel.contracts.{module}").CONTRACT for module in TASK_MODULES]
    return {c.name: c for c in contracts}


def get_contract(name: str) -> TaskContract:
    contracts = _registry()
    try:
        return contracts[name]
    except KeyError:
        raise UnknownTaskError(f"unknown task {name!r} (known: {', '.join(contracts)})") from None


def contract_names() -> tuple[str, ...]:
    return tuple(_registry())


def space_tasks() -> tuple[str, ...]:
    """The tasks whose outputs are vectors in an embedding space (their contracts declare one)."""
    return tuple(name for name, c in _registry().items() if c.space is not None)


def settings_union() -> Any:
    """Every registered task section as one pydantic type, discriminated by its `task` field."""
    sections = tuple(c.settings for c in _registry().values())
    return Annotated[Union[sections], Field(discriminator="task")]  # noqa: UP007 (a runtime tuple)
