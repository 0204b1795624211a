"""The token-classification contract (named-entity recognition and other per-token taggers): a
tokenizer, the labels (`B-PER`, `I-PER`, `O`... in the IOB2 scheme, or plain tags), and a gate on
per-token probabilities and token-label agreement."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from ortpack.kernel.contracts.base import TEXT_REQUEST, TOKEN_INPUTS, TaskContract, TextOptions, TextSettings, fixed
from ortpack.kernel.contracts.tensors import BATCH, Signature, Tensor
from ortpack.kernel.gates import ceiling, decisive_rows, floor, gate_table


class TokenOptions(TextOptions):
    """A tagger's export options: the token limit, and how the server aggregates tokens unless a
    request says otherwise (`--task-option aggregation=none`; default "first")."""

    aggregation: Literal["first", "none"] | None = None


class TokenClassificationSettings(TextSettings):
    task: Literal["token-classification"] = "token-classification"
    labels: list[str] = Field(min_length=1)
    # How the server groups tokens into words and entities unless a request says otherwise:
    # "first" (a word takes its first token's label; B-/I- words join into entities), or "none"
    # (every token with its own label)
    aggregation: Literal["first", "none"] = "first"


# Per-token probabilities; a served item's rows run to the bundle's max length, PAD past its tokens
OUTPUT = "probabilities"
SIGNATURE = Signature(
    inputs=TOKEN_INPUTS, outputs=(Tensor(OUTPUT, "float32", (BATCH, "sequence", "labels")),), request=TEXT_REQUEST
)

CONTRACT = TaskContract(
    name="token-classification",
    options=TokenOptions,
    settings=TokenClassificationSettings,
    signature=fixed(SIGNATURE),
    gates=gate_table(
        ceiling("max_abs_diff"),
        ceiling("mean_abs_diff"),
        floor("token_agreement"),
        floor("decisive_token_agreement"),
    ),
    engine="ortpack.kernel.engines.token_classification",
    plugin="ortpack.serving.tasks.token_classification",
)


# Every position past a text's tokens in a row of per-token probabilities (references, probe
# rows and served rows alike): probabilities are never negative
PAD = -1.0


def token_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Rows of per-token probabilities `[n, width, labels]` (PAD past each text, as the
    reference marks it): max/mean |diff| over real tokens, the share of tokens whose label is
    kept, and that share on the decisive tokens (their top label leads by DECISIVE_MARGIN)."""
    real = reference[..., 0] != PAD
    ref = reference[real].astype(np.float64)
    cand = candidate[real].astype(np.float64)
    if not len(ref):
        return {}
    diff = np.abs(cand - ref)
    same = cand.argmax(axis=1) == ref.argmax(axis=1)
    decisive = decisive_rows(ref)
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "token_agreement": float(same.mean()),
        "decisive_token_agreement": float(same[decisive].mean()) if decisive.any() else 1.0,
        "tokens": float(len(ref)),
    }
