"""The text-embedding engine: token ids in, the pooled (and normalised) `sentence_embedding` per
text out; pooling is in the graph. Probes compare vectors: distance, cosine, neighbours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortpack.kernel.contracts.text_embedding import OUTPUT
from ortpack.kernel.engine import EngineSpec, Item, stack
from ortpack.kernel.engines.tokens import TokenEngine
from ortpack.kernel.gates import embedding_metrics


def probe_metrics(reference: list[Item], candidate: list[Item], _inputs: Sequence[Any]) -> dict[str, float]:
    return embedding_metrics(stack(reference, OUTPUT), stack(candidate, OUTPUT))


ENGINE = EngineSpec(name="text-embedding", open=TokenEngine, probe_metrics=probe_metrics)
