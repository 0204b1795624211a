"""The token-classification engine: token ids in, each text's per-token `probabilities` out, as
rows of the bundle's max length with PAD past the text's tokens (so rows of every batch and
bucket stack). Probes compare probabilities and labels over the real tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.contracts.token_classification import OUTPUT, PAD, token_metrics
from ortpack.kernel.engine import EngineSpec, Item, stack
from ortpack.kernel.engines.tokens import TokenEngine


class TokenTaggerEngine(TokenEngine):
    def post(self, payloads: Sequence[Any], output: np.ndarray) -> np.ndarray:
        rows = np.full((len(payloads), self.max_length, output.shape[-1]), PAD, dtype=np.float32)
        for row, tokens in enumerate(payloads):
            rows[row, : len(tokens)] = output[row, : len(tokens)]
        return rows


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return token_metrics(stack(reference, OUTPUT), stack(candidate, OUTPUT))


ENGINE = EngineSpec(name="token-classification", open=TokenTaggerEngine, probe_metrics=probe_metrics)
