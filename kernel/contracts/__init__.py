"""Task contracts: for each task, one torch-free module (kernel/contracts/<task>.py) that owns
its data: the manifest section it writes and reads, the numbers that gate it and which serving
plugin serves it. The bundle's Manifest is a union of the registered sections keyed by task, the
gate is each task's own table, and the server finds a task's plugin here.

Contracts are registered in `_registry` below (explicitly: no import side effects). The pipeline's
side of a task (its exporter, comparison, int8 recipes) is its family in components/core/tasks/.
"""

from __future__ import annotations

from functools import cache
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


@cache
def _registry() -> dict[str, TaskContract]:
    """The registered tasks, one line each: kernel/contracts/<module>.py's CONTRACT, in this order.
    Imported by name in the code (a reader and tests/test_import_boundary.py see every task's
    edges) but on first use: the contracts' gate tables pull numpy, which compiling the pipeline
    never needs."""
    from ortpack.kernel.contracts import (
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

    contracts = (
        text_embedding.CONTRACT,
        image_classification.CONTRACT,
        text_classification.CONTRACT,
        token_classification.CONTRACT,
        object_detection.CONTRACT,
        image_embedding.CONTRACT,
        semantic_segmentation.CONTRACT,
        text_generation.CONTRACT,
        automatic_speech_recognition.CONTRACT,
    )
    return {contract.name: contract for contract in contracts}


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
