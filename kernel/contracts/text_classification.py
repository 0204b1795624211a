"""The text-classification contract: a tokenizer, the classifier head (its activation, and whether
it scores query/document pairs), the labels, and a gate on probabilities, top-k and ranking."""

from __future__ import annotations

from typing import Literal

from ortpack.kernel.contracts.base import (
    TEXT,
    TEXT_REQUEST,
    TOKEN_INPUTS,
    Strict,
    TaskContract,
    TextOptions,
    TextSettings,
)
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, floor, gate_table


class Classification(Strict):
    """The head of a text classifier: the activation baked into the graph, and whether it scores
    (query, document) pairs (a cross-encoder, served as /v1/rerank) or single texts."""

    activation: Literal["softmax", "sigmoid", "none"]
    pairs: bool


class TextClassificationSettings(TextSettings):
    task: Literal["text-classification"] = "text-classification"
    classification: Classification
    labels: list[str] | None = None


# A classifier answers `probabilities` per label; a cross-encoder one relevance score per (query,
# document) row, sent as two strings a row
PAIR_SIGNATURE = Signature(
    inputs=TOKEN_INPUTS,
    outputs=(Tensor("scores", "float32", (BATCH, 1)),),
    request=(Tensor(TEXT.name, "string", (BATCH, 2)),),
)
LABEL_SIGNATURE = Signature(
    inputs=TOKEN_INPUTS, outputs=(Tensor("probabilities", "float32", (BATCH, "labels")),), request=TEXT_REQUEST
)


def signature(settings: TextClassificationSettings) -> Signature:
    """A classifier answers `probabilities` per label; a cross-encoder answers one relevance score
    per (query, document) row, sent as two strings a row."""
    return PAIR_SIGNATURE if settings.classification.pairs else LABEL_SIGNATURE


CONTRACT = TaskContract(
    name="text-classification",
    options=TextOptions,
    settings=TextClassificationSettings,
    signature=signature,
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("top1_agreement"),
        floor("top5_agreement"),
        floor("decisive_top1_agreement"),
        floor("rank_agreement"),
    ),
    engine="ortpack.kernel.engines.text_classification",
    plugin="ortpack.serving.tasks.text_classification",
)
