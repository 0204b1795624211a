"""The int8 recipes, by name: what a task's int8 search (or first-that-passes loop) tries, and
what a build pins with `--int8-recipe NAME` (the pipeline's `int8_recipe` parameter).

Pinning skips the search: one graph is built with the named recipe and the validate step gates it
as always. A search team pins the recipe their index was built with, so that a rebuild (a new
onnxruntime, a new checkpoint revision) keeps the embedding space when the search would now pick
another recipe (`ortpack bundle diff` says whether it did).

Data only: nothing here imports onnx, onnxruntime or torch, so the CLI and the task registry can
check a name before any heavy work. The graphs are written by components/core/quantization/graph_recipes.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# what optimize.json's `int8.rule` says of a pinned recipe
PINNED_RULE = "pinned by the build (int8_recipe); not searched"


@dataclass(frozen=True)
class DynamicInt8:
    """One dynamic int8 recipe for transformer graphs (`quantize_int8_dynamic`). Text embeddings
    search over these (components/core/quantization/int8_search.py), or a build pins one by name; the default
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


@dataclass(frozen=True)
class StaticInt8:
    """One static int8 (QDQ) recipe for the image families (components/core/quantization/static_int8.py):
    every convolution's weights per output channel, its activations uint8 calibrated by min/max
    on photos, the activations between convolutions (ReLU/Clip, Add, pooling) kept in int8 where
    ONNX Runtime has the kernel.

    weight_bits: 8 (s8 in [-127, 127]) or 7 ([-64, 64], `reduce_range`). ONNX Runtime's u8 x s8
        kernels sum 8-bit products exactly only where the CPU has a VNNI dot product (AVX-512 VNNI,
        AVX-VNNI, AMX); with AVX2 alone pairs of products are added in saturating int16, so 8-bit
        weights give other numbers there. 7 bits are exact on every x86-64 CPU and lose accuracy.
    bias_correction: each convolution's bias absorbs the mean its quantized weights shift the
        output by (the weights' rounding error times the mean of the layer's fp32 input, measured on
        the calibration photos): what keeps depthwise networks near fp32 (EfficientNet-Lite0 top-1
        agreement with PyTorch 0.875 -> 0.94 on 48 photos, measured in one run).
    activations ("wide"): the operators between convolutions run in int8 too (Add, Concat, MaxPool,
        Resize, GlobalAveragePool, and SiLU's Sigmoid and Mul: QLinearAdd, QLinearConcat, ...),
        which saves a dequantize/quantize pair around each. YOLOv8s: 39 against 48 ms at batch 1,
        but scores moved by up to 0.18 where convolutions alone moved them by 0.14.
    """

    weight_bits: int = 8
    bias_correction: bool = True
    activations: bool = False

    @property
    def name(self) -> str:
        return (
            f"s{self.weight_bits}"
            + ("-wide" if self.activations else "")
            + ("" if self.bias_correction else "-uncorrected")
        )

    @property
    def exact_everywhere(self) -> bool:
        """Whether every x86-64 CPU computes this recipe's integer products exactly."""
        return self.weight_bits <= 7


# The static recipes a build may pin by name (the search picks the weight width by the build CPU,
# components/core/quantization/static_int8.py, and tries the uncorrected form when the corrected one misses).
STATIC_INT8_RECIPES: dict[str, StaticInt8] = {
    r.name: r
    for bits in (8, 7)
    for wide in (True, False)
    for r in (StaticInt8(bits, True, wide), StaticInt8(bits, False, wide))
}
