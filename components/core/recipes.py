"""The int8 recipes, by name: what a task's int8 search (or first-that-passes loop) tries, and
what a build pins with `--int8-recipe NAME` (the pipeline's `int8_recipe` parameter).

Pinning skips the search: one graph is built with the named recipe and the validate step gates it
as always. A search team pins the recipe their index was built with, so that a rebuild (a new
onnxruntime, a new checkpoint revision) keeps the embedding space when the search would now pick
another recipe (`ortpack bundle diff` says whether it did).

Data only: nothing here imports onnx, onnxruntime or torch, so the CLI and the task registry can
check a name before any heavy work. The graphs are written by components/core/graph_recipes.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# what optimize.json's `int8.rule` says of a pinned recipe
PINNED_RULE = "pinned by the build (int8_recipe); not searched"


@dataclass(frozen=True)
class DynamicInt8:
    """One dynamic int8 recipe for transformer graphs (`quantize_int8_dynamic`). Text embeddings
    search over these (components/core/int8_search.py), or a build pins one by name; the default
    is per channel.

    per_channel: one weight scale per output column (else one per tensor).
    fp32_ffn_output: the MatMuls that narrow the hidden state back from the FFN's width (B is
        [K, N] with K > N, the FFN's second projection, where outlier activations live) stay fp32.
    int8_embeddings: the embedding tables are stored in 8 bits (u8, one scale per table; ONNX
        Runtime's QEmbedLayerNormalization where the embeddings are fused, else Gather then
        DequantizeLinear): MiniLM's 47 MB word table becomes 12 MB.
    """

    per_channel: bool = True
    fp32_ffn_output: bool = False
    int8_embeddings: bool = False

    @property
    def name(self) -> str:
        base = "per-tensor" if not self.per_channel else "ffn-out-fp32" if self.fp32_ffn_output else "per-channel"
        return base + ("+int8-embeddings" if self.int8_embeddings else "")


# The MatMul recipes text embeddings search over, the default first (each within budget is then
# also tried with int8 embedding tables). 8-bit s8 weights are not offered: their numbers depend
# on the CPU (see graph_recipes.quantize_int8_dynamic).
PER_CHANNEL = DynamicInt8()
DYNAMIC_INT8_RECIPES = (PER_CHANNEL, DynamicInt8(per_channel=False), DynamicInt8(fp32_ffn_output=True))


# Every dynamic recipe a text task accepts, by name: each MatMul recipe and its int8-embeddings form.
DYNAMIC_INT8_BY_NAME: dict[str, DynamicInt8] = {
    variant.name: variant for r in DYNAMIC_INT8_RECIPES for variant in (r, replace(r, int8_embeddings=True))
}


def dynamic_recipe_names() -> tuple[str, ...]:
    """Every dynamic recipe a text task accepts: each MatMul recipe and its int8-embeddings form."""
    return tuple(DYNAMIC_INT8_BY_NAME)


def dynamic_recipe(name: str) -> DynamicInt8:
    """The dynamic recipe called `name` (one of `dynamic_recipe_names()`)."""
    return DYNAMIC_INT8_BY_NAME[name]


# Static int8 recipes for convolution nets, fastest first (components/core/tasks/image_classification.py
# builds each in turn and keeps the first that passes the int8 gate on the validation images):
#   s7: every convolution, 7-bit s8 per-channel weights (exact on every x86-64 CPU, as for text),
#       ReLU and Clip quantized with their convolution;
#   s7-conv: the same with only the convolutions quantized (the activations' ranges then span the
#       convolutions' raw outputs: coarser, but it suits some nets better, measured below);
#   u8-pointwise: u8 x u8 per-channel 8-bit weights (no saturation on any x86-64 CPU either),
#       depthwise convolutions in float: their 9 or 25 weights per channel cannot take 7 bits.
STATIC_INT8_RECIPES: dict[str, dict[str, Any]] = {
    "s7": {"unsigned_weights": False, "float_depthwise": False, "ops": ["Conv", "Clip", "Relu"]},
    "s7-conv": {"unsigned_weights": False, "float_depthwise": False, "ops": ["Conv"]},
    "u8-pointwise": {"unsigned_weights": True, "float_depthwise": True, "ops": ["Conv", "Clip", "Relu"]},
}
