"""The text-embedding contract: a tokenizer, the pooling baked into the graph, and a gate on
vector distance, cosine and nearest-neighbour agreement."""

from __future__ import annotations

from typing import Literal

from ortpack.kernel.contracts.base import Strict, TaskContract, TextOptions, TextSettings
from ortpack.kernel.gates import ceiling, floor, gate_table


class Pooling(Strict):
    """The post-processing baked into a text-embedding graph."""

    mode: Literal["mean", "cls", "max"]
    normalize: bool


class TextEmbeddingSettings(TextSettings):
    task: Literal["text-embedding"] = "text-embedding"
    pooling: Pooling


CONTRACT = TaskContract(
    name="text-embedding",
    options=TextOptions,
    settings=TextEmbeddingSettings,
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("min_cosine", "min_cosine"),
        floor("mean_cosine", "mean_cosine"),
        floor("neighbour_agreement"),
    ),
    plugin="ortpack.serving.tasks.text_embedding",
)
