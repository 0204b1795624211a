"""The serving task contract: what a task plugin (serving/tasks/<task>.py) defines and what the
server calls. The registry that maps a bundle's task to its plugin is `ortpack.serving.tasks` (the
package); plugins import this module, never the package, so no import runs in a circle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from ortpack.kernel.bundle import Manifest, Variant
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.http import RouteSpec

Prepare = Callable[[Sequence[Any]], list[Any]]


@dataclass(frozen=True, kw_only=True)
class LoadContext:
    """What a task needs to open a loaded variant: the manifest, the session, the verified bytes
    of the bundle's shared files (tokenizer, probe) by path, and the server's options."""

    manifest: Manifest
    variant: Variant
    session: Any
    files: dict[str, bytes]
    config: ServeConfig


class TaskRuntime(Protocol):
    """One loaded variant of one task, as the server uses it."""

    backend: Any  # ortpack.kernel.backend.Backend: run(payloads) -> rows
    batching: str  # how it batches, for the start-up line
    output_name: str
    output_dim: int

    def item_cost(self) -> tuple[Callable[[Any], float] | None, float]:
        """(cost of one payload, most cost per batch): images are capped in pixels per batch."""
        ...

    def item_tokens(self) -> Callable[[Any], int] | None:
        """Tokens of one payload (text: the token budget and padding metrics count them); None
        when payloads are not tokens (an image's len() is its height)."""
        ...

    def warm_up_batches(self, max_batch_size: int) -> list[list[Any]]:
        """Batches of payloads that touch every shape the server will run (biggest first)."""
        ...

    def probe_prepare(self) -> Prepare:
        """Probe inputs (texts, encoded images) to payloads, exactly as requests are prepared."""
        ...

    def v2_inputs(self) -> list[dict[str, Any]]:
        """Open Inference Protocol input tensors (name, datatype, shape)."""
        ...

    def v2_outputs(self) -> list[dict[str, Any]]:
        """Open Inference Protocol output tensors (name, datatype, shape; -1 where it varies)."""
        ...

    async def v2_payloads(self, tensor: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        """(payloads, buckets) from the request's one input tensor (checked)."""
        ...

    def routes(self) -> list[RouteSpec]:
        """The task's own HTTP routes (OpenAI embeddings, classification, reranking)."""
        ...

    def schemas(self) -> dict[str, Any]:
        """OpenAPI component schemas its routes refer to."""
        ...

    def describe(self) -> str:
        """One sentence for the OpenAPI document: what this server does."""
        ...


@dataclass(frozen=True, kw_only=True)
class ServingTask:
    """A task as the server knows it: how to open a variant, and how to prepare probe inputs
    outside a server (the pipeline's validate step runs the node check on the build machine)."""

    name: str
    open: Callable[[LoadContext], TaskRuntime]
    # (the task's typed manifest section: tokenizer, preprocessing...; shared files by path) -> prepare
    probe_prepare: Callable[[Any, dict[str, bytes]], Prepare]
    # (session, the task's manifest section, the output's width) -> the backend that runs
    # batches (ortpack.kernel.backend.Backend)
    backend: Callable[[Any, Any, int], Any]
    # (reference rows, candidate rows, probe inputs) -> the gated metrics a probe can measure
    probe_metrics: Callable[[np.ndarray, np.ndarray, Sequence[Any]], dict[str, float]]
