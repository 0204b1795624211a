"""Weight-only quantization of a decoder's matrices: ONNX Runtime's `MatMulNBits` (int4 or int8
weights in blocks along the input dimension, one scale per block), optionally the token
embedding table too (`GatherBlockQuantized`), and the search that picks the recipe and keeps the
costliest layers in float until the gate passes.

Weight-only is the route for decoders on CPUs: a decode step reads every weight once per token
and multiplies it by a handful of rows, so it is bound by memory traffic, which 4-bit weights cut
by ~7x. The activations stay float; `accuracy_level` 4 lets ONNX Runtime quantize them to int8
per block inside the kernel (faster where the CPU has int8 dot products; reported to change
greedy tokens on some models, onnxruntime issue 29849), 0 computes in float: the gate decides.

Layers are grouped the way their sensitivity differs: the head (`lm_head`), the embedding table,
and each transformer block. A group's cost is the KL divergence (PyTorch's next-token
distribution against the candidate's) that quantizing it alone adds; when the best recipe misses
the gate, groups go back to float, costliest first, until it passes (the manifest records each
with its cost).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger("ortpack.int4")

HEAD, EMBEDDINGS = "head", "embeddings"
_BLOCK = re.compile(r"/(?:layers|h|blocks|layer|decoder\.layers)\.(\d+)/")


@dataclass(frozen=True, kw_only=True)
class WeightOnly:
    """One weight-only recipe: the weights' bits, the block size, ONNX Runtime's accuracy level,
    whether the embedding table is quantized too, and the groups kept in float."""

    bits: Literal[4, 8] = 4
    block_size: int = 32
    accuracy_level: Literal[0, 4] = 4
    embeddings: bool = False
    keep_float: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        name = f"int{self.bits}-b{self.block_size}-a{self.accuracy_level}" + ("-emb" if self.embeddings else "")
        return name + (f"+{len(self.keep_float)}float" if self.keep_float else "")


def gemm_to_matmul(model: Any) -> int:
    """Rewrite `Gemm(A, B, C)` with a constant B (GPT-2's Conv1D layers trace to it) as
    `MatMul(A, B) + C`, which the weight-only quantizer takes; returns how many were rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    rewritten = 0
    nodes = []
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if (
            node.op_type != "Gemm"
            or node.input[1] not in weights
            or attrs.get("transA", 0)
            or attrs.get("alpha", 1.0) != 1.0
            or attrs.get("beta", 1.0) != 1.0
        ):
            nodes.append(node)
            continue
        b = weights[node.input[1]]
        if attrs.get("transB", 0):
            array = numpy_helper.to_array(b).T.copy()
            b.CopyFrom(numpy_helper.from_array(array, b.name))
        product = node.output[0] + "_matmul" if len(node.input) > 2 else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], node.input[1]], [product], name=node.name + "_MatMul"))
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=node.name + "_Add"))
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    if rewritten:
        onnx.checker.check_model(model)
    return rewritten


def layer_groups(model: Any) -> dict[str, list[str]]:
    """The quantizable nodes by group: `head` (the MatMul that gives the logits), `embeddings`
    (the Gather of the token table), and `block N` per transformer block."""
    weights = {t.name: t for t in model.graph.initializer}
    logits = model.graph.output[0].name
    producers = {out: node for node in model.graph.node for out in node.output}
    head = _head_matmul(producers, logits)
    groups: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            match = _BLOCK.search(node.name)
            group = HEAD if node.name == head else f"block {int(match[1])}" if match else "other"
        elif node.op_type == "Gather" and node.input[0] in weights and len(weights[node.input[0]].dims) == 2:
            group = EMBEDDINGS
        else:
            continue
        groups.setdefault(group, []).append(node.name)
    return groups


def _head_matmul(producers: dict[str, Any], output: str) -> str | None:
    """The last MatMul on the way back from the logits (through casts, adds, slices, softcapping)."""
    seen = 0
    name: str | None = output
    while name in producers and seen < 32:
        node = producers[name]
        if node.op_type == "MatMul":
            return str(node.name)
        name = node.input[0] if node.input else None
        seen += 1
    return None


def quantize_weight_only(src: Path, dst: Path, recipe: WeightOnly, save: Callable[[Any, Path], Any]) -> dict[str, int]:
    """Write `src` quantized by `recipe` to `dst` (with `save(model, path)`, which places large
    weights in a data file); returns the nodes quantized by kind."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    gemms = gemm_to_matmul(model)
    groups = layer_groups(model)
    excluded = [name for group in recipe.keep_float for name in groups.get(group, [])]
    ops = ("MatMul", "Gather") if recipe.embeddings else ("MatMul",)
    if not recipe.embeddings:
        excluded += groups.get(EMBEDDINGS, [])
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        model,
        bits=recipe.bits,
        block_size=recipe.block_size,
        is_symmetric=True,
        accuracy_level=recipe.accuracy_level,
        nodes_to_exclude=excluded,
        op_types_to_quantize=ops,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quantizer.process()
    out = quantizer.model.model
    save(out, dst)
    kinds = [n.op_type for n in out.graph.node]
    return {
        "MatMulNBits": kinds.count("MatMulNBits"),
        "GatherBlockQuantized": kinds.count("GatherBlockQuantized"),
        "float_matmuls": sum(len(groups.get(g, [])) for g in recipe.keep_float),
        "gemm_rewritten": gemms,
    }


@dataclass(frozen=True)
class Judgement:
    """A candidate's numbers against PyTorch and what it misses of the gate."""

    values: dict[str, float]
    misses: list[str]


def keep_costliest(
    base: WeightOnly,
    groups: Sequence[str],
    build: Callable[[WeightOnly, Path], None],
    judge: Callable[[Path], Judgement],
    cost: Callable[[Judgement], float],
    work: Path,
) -> tuple[WeightOnly, dict[str, float], dict[str, dict[str, Any]]]:
    """When `base` misses the gate: measure each group's cost (quantized alone, every other group
    in float: the KL it adds), then return groups to float, costliest first, until the candidate
    passes or every group is float. Returns (the recipe reached, each group's cost, the
    candidates tried with their numbers)."""
    everything = tuple(groups)
    costs: dict[str, float] = {}
    for group in groups:
        alone = replace(base, keep_float=tuple(g for g in everything if g != group))
        path = work / f"alone-{group.replace(' ', '')}.onnx"
        build(alone, path)
        costs[group] = round(cost(judge(path)), 6)
        _remove(path)
    log.info("int4 layer costs (KL each adds alone): %s", ", ".join(f"{g} {c:.3g}" for g, c in costs.items()))
    order = sorted(groups, key=lambda g: -costs[g])
    tried: dict[str, dict[str, Any]] = {}
    recipe = base
    for count in range(1, len(order) + 1):
        recipe = replace(base, keep_float=tuple(order[:count]))
        path = work / f"{recipe.name}.onnx"
        build(recipe, path)
        judged = judge(path)
        tried[recipe.name] = {"quality": judged.values, "passed": not judged.misses, "misses": judged.misses}
        _remove(path)
        if not judged.misses:
            break
    return recipe, costs, tried


def _remove(path: Path) -> None:
    for file in (path, path.with_name(path.name + ".data")):
        file.unlink(missing_ok=True)
