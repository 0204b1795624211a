"""Named tensors: what a task takes and answers, declared once in its contract.

A `Tensor` is a name, a dtype and a shape whose dimensions are sizes or names. A leading "batch"
means one per item (a text, an image); any other leading name is a count that varies per item
(an image's detections), so the item's part of such a tensor is its own rows. A `Signature` is a
task's graph inputs and outputs, and what a request carries when that is not the graph's inputs
(text goes in as strings and is tokenized). The exporter names the graph's tensors from it, the
build's signature check compares a graph with it, the Open Inference Protocol route reads and
answers by it, the probe stores outputs by its names, and the batcher's cost counts the free
dimensions of its request input.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# numpy dtype name -> Open Inference Protocol datatype; "string" is a text (BYTES)
V2_DATATYPES = {
    "float32": "FP32",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "uint8": "UINT8",
    "string": "BYTES",
}
# ONNX Runtime's element type of each dtype, as `session.get_inputs()[i].type` says it
ORT_TYPES = {
    "float32": "tensor(float)",
    "float16": "tensor(float16)",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "uint8": "tensor(uint8)",
    "string": "tensor(string)",
}
BATCH = "batch"


@dataclass(frozen=True)
class Tensor:
    """One named tensor. `shape`: each dimension a size or a name ("batch" first: one per item;
    another name first: a count that varies per item). `optional`: a graph input some models lack
    (token_type_ids). `item_index`: an output holding each row's item (a detection's image): the
    Open Inference Protocol answer numbers the request's items there."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    optional: bool = False
    item_index: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in V2_DATATYPES:
            raise ValueError(f"tensor {self.name}: unknown dtype {self.dtype!r} (known: {', '.join(V2_DATATYPES)})")
        if not self.shape:
            raise ValueError(f"tensor {self.name}: a task's tensors have at least one dimension")

    @property
    def per_item(self) -> bool:
        """One row per item (a leading "batch"), else a varying count of rows per item."""
        return self.shape[0] == BATCH

    @property
    def datatype(self) -> str:
        return V2_DATATYPES[self.dtype]

    def resolved(self, sizes: Mapping[str, int]) -> list[int | str]:
        """The shape with the named dimensions `sizes` knows replaced by their size."""
        return [sizes.get(d, d) if isinstance(d, str) else d for d in self.shape]

    def spec(self, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """What an export records of this tensor (and a manifest's `inputs`/`outputs` hold): name,
        dtype and the shape with the dimensions `sizes` knows fixed."""
        return {"name": self.name, "dtype": self.dtype, "shape": self.resolved(sizes or {})}

    def dynamic_axes(self, sizes: Mapping[str, int] | None = None) -> dict[int, str]:
        """The axes an exporter leaves free (`torch.onnx.export`'s `dynamic_axes`): every named
        dimension the model does not fix (`sizes`: those it fixes, such as the classes)."""
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str) and d not in (sizes or {})}

    def v2(self, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Open Inference Protocol metadata: -1 for every dimension that is not fixed."""
        shape = [d if isinstance(d, int) else -1 for d in self.resolved(sizes or {})]
        return {"name": self.name, "datatype": self.datatype, "shape": shape}


@dataclass(frozen=True)
class Signature:
    """A task's tensors: the graph's inputs and outputs, and what an inference request carries
    (`request`, when it is not the graph's inputs: texts are tokenized first)."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    request: tuple[Tensor, ...] = ()

    @property
    def served_inputs(self) -> tuple[Tensor, ...]:
        return self.request or self.inputs

    def output(self, name: str) -> Tensor:
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor
        raise KeyError(f"no output {name!r} (outputs: {', '.join(t.name for t in self.outputs)})")

    def sizes(self, recorded: list[Any]) -> dict[str, int]:
        """Named dimensions' sizes as a bundle's manifest or an export recorded them (its
        `inputs`/`outputs`: TensorSpecs or their dicts; a fixed width where the declaration has a
        name, such as "dim")."""
        declared = {t.name: t for t in (*self.inputs, *self.outputs)}
        found: dict[str, int] = {}
        for spec in recorded:
            name, shape = (spec["name"], spec["shape"]) if isinstance(spec, Mapping) else (spec.name, spec.shape)
            tensor = declared.get(name)
            if tensor is None or len(shape) != len(tensor.shape):
                continue
            for want, got in zip(tensor.shape, shape, strict=True):
                if isinstance(want, str) and isinstance(got, int):
                    found[want] = got
        return found

    def check_graph(self, inputs: list[Any], outputs: list[Any]) -> list[str]:
        """How a graph (ONNX Runtime's `get_inputs()`/`get_outputs()`: name, type, shape) differs
        from this signature: a missing, unknown or mistyped tensor, a wrong rank, a fixed
        dimension of another size, a named dimension of an input (or an output's batch) that the
        graph fixes. Empty when it matches."""
        return _compare("input", self.inputs, inputs) + _compare("output", self.outputs, outputs)

    def names(self) -> dict[str, list[str]]:
        return {"inputs": [t.name for t in self.inputs], "outputs": [t.name for t in self.outputs]}


def _compare(kind: str, declared: tuple[Tensor, ...], graph: list[Any]) -> list[str]:
    found = {g.name: g for g in graph}
    misses = [
        f"unexpected {kind} {name} (declared: {', '.join(t.name for t in declared)})"
        for name in found
        if name not in {t.name for t in declared}
    ]
    for tensor in declared:
        g = found.get(tensor.name)
        if g is None:
            if not tensor.optional:
                misses.append(f"missing {kind} {tensor.name} ({tensor.dtype} {list(tensor.shape)})")
            continue
        if g.type != ORT_TYPES[tensor.dtype]:
            misses.append(f"{kind} {tensor.name} is {g.type}, expected {ORT_TYPES[tensor.dtype]}")
        shape = list(g.shape)
        if len(shape) != len(tensor.shape):
            misses.append(f"{kind} {tensor.name} has shape {shape}, expected {list(tensor.shape)}")
            continue
        for want, got in zip(tensor.shape, shape, strict=True):
            if isinstance(want, int) and isinstance(got, int) and want != got:
                misses.append(f"{kind} {tensor.name} has shape {shape}, expected {list(tensor.shape)}")
                break
            # an input's named dimensions take any size a request sends; an output's may be a
            # width the graph fixes (an embedding's "dim"), but never its batch
            if isinstance(want, str) and isinstance(got, int) and (kind == "input" or want == BATCH):
                misses.append(f"{kind} {tensor.name} has shape {shape}: its {want} axis must stay dynamic")
                break
    return misses
