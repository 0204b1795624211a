"""The text-embedding contract: a tokenizer, the pooling baked into the graph, and a gate on
vector distance, cosine and nearest-neighbour agreement."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ortpack.kernel.contracts.base import (
    TEXT_REQUEST,
    TOKEN_INPUTS,
    SpaceDeclaration,
    Strict,
    TaskContract,
    TextOptions,
    TextSettings,
    fixed,
)
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table


class Pooling(Strict):
    """The post-processing baked into a text-embedding graph."""

    mode: Literal["mean", "cls", "max"]
    normalize: bool


class TextEmbeddingSettings(TextSettings):
    task: Literal["text-embedding"] = "text-embedding"
    pooling: Pooling


OUTPUT = "sentence_embedding"
SIGNATURE = Signature(inputs=TOKEN_INPUTS, outputs=(Tensor(OUTPUT, "float32", (BATCH, "dim")),), request=TEXT_REQUEST)


def space_facts(settings: TextEmbeddingSettings, files: Mapping[str, Any]) -> dict[str, Any] | None:
    """What decides a text's vector beyond the model: the tokenizer's bytes, pooling,
    normalisation and max length (None when the tokenizer is not listed)."""
    vocab = files.get(settings.tokenizer.file)
    if vocab is None:
        return None
    return {
        "tokenizer_sha256": vocab.sha256,
        "pooling": settings.pooling.mode,
        "normalize": settings.pooling.normalize,
        "max_length": settings.tokenizer.max_length,
    }


CONTRACT = TaskContract(
    name="text-embedding",
    options=TextOptions,
    settings=TextEmbeddingSettings,
    signature=fixed(SIGNATURE),
    space=SpaceDeclaration(output=OUTPUT, facts=space_facts),
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("min_cosine", "min_cosine"),
        floor("mean_cosine", "mean_cosine"),
        floor("neighbour_agreement"),
    ),
    engine="ortpack.kernel.engines.text_embedding",
    plugin="ortpack.serving.tasks.text_embedding",
)
