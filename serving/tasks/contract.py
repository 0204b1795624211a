"""The serving task contract: what a task plugin (serving/tasks/<task>.py) defines and what the
server calls. A plugin is the HTTP half of a task: its routes, request and answer bodies, and how
an Open Inference Protocol request's tensors become its engine's payloads; the engine half
(ortpack.kernel.engines.<task>: prepare, run, post-process, probe metrics) is the kernel's. The
registry that maps a bundle's task to its plugin is `ortpack.serving.tasks` (the package);
plugins import this module, never the package, so no import runs in a circle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from ortpack.kernel.bundle import Manifest, Variant
    from ortpack.kernel.engine import Engine
    from ortpack.serving.config import ServeConfig
    from ortpack.serving.http import RouteSpec


@dataclass(frozen=True, kw_only=True)
class LoadContext:
    """What a plugin needs to serve a loaded variant: the manifest, the variant, its engine and the
    server's options."""

    manifest: Manifest
    variant: Variant
    engine: Engine
    config: ServeConfig


@dataclass(frozen=True, kw_only=True)
class InferInput:
    """One Open Inference Protocol input tensor of a request (KServe's `InferInput`): its name and
    datatype are the task's declared ones (the v2 route checked them); its shape and data are as
    the client sent them (data: a JSON list, or a flat numpy array from the binary extension),
    for the plugin to check against what its engine takes."""

    name: str
    datatype: str
    shape: Any
    data: Any

    @classmethod
    def of(cls, tensor: dict[str, Any]) -> InferInput:
        """From a request's tensor object (name and datatype already checked)."""
        name, datatype = str(tensor["name"]), str(tensor["datatype"])
        return cls(name=name, datatype=datatype, shape=tensor.get("shape"), data=tensor.get("data"))


EngineKind = TypeVar("EngineKind")


def engine_as(ctx: LoadContext, kind: type[EngineKind]) -> EngineKind:
    """The loaded engine as the kind a plugin is written for (an image task's `ImageEngine`, whose
    decoder its routes use; a text task's `TokenEngine`, whose encoder they use): the seam between
    a plugin and its engine is typed, and a bundle whose engine is another kind is refused here."""
    engine = ctx.engine
    if not isinstance(engine, kind):
        raise TypeError(f"{ctx.manifest.task} serving needs a {kind.__name__}, not a {type(engine).__name__}")
    return engine


class TaskRuntime(Protocol):
    """The HTTP side of one loaded variant of one task."""

    async def v2_payloads(self, inputs: dict[str, InferInput]) -> tuple[list[Any], list[Any]]:
        """(payloads, buckets) from a request's input tensors by name (each named and typed as the
        task declares it; their data and shapes are the plugin's to check)."""
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


@runtime_checkable
class Lifecycle(Protocol):
    """A runtime with work of its own beside the batcher (the generation loop): started once the
    server is warm, before it turns ready (`service`: the ModelService, whose memory budget and
    metrics it may use), and stopped first at shutdown."""

    async def start(self, service: Any) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ServingTask:
    """A task as the server knows it: how to open the HTTP side of a loaded variant."""

    name: str
    open: Callable[[LoadContext], TaskRuntime]
