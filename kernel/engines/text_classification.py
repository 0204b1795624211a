"""The text-classification engine: token ids (or (query, document) pairs with segment ids) in,
`probabilities` per label (classifiers) or one relevance score (`scores`: cross-encoders) per
item out; the activation is in the graph. Probes compare probabilities and top-k (classifiers) or
scores and the ranking within each query's documents (cross-encoders)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ortpack.kernel.engine import EngineSpec, Item, stack
from ortpack.kernel.engines.tokens import TokenEngine
from ortpack.kernel.gates import probability_metrics, rank_agreement


def probe_metrics(reference: list[Item], candidate: list[Item], inputs: Sequence[Any]) -> dict[str, float]:
    """Classifiers: probability differences and top-1/top-5 agreement. Cross-encoders: score
    differences and rank agreement within each query's documents."""
    (name,) = reference[0]
    ref, cand = stack(reference, name), stack(candidate, name)
    if ref.shape[1] > 1:
        return probability_metrics(ref, cand)
    queries = [str(x[0]) if isinstance(x, tuple) else "" for x in inputs]
    groups = np.unique(np.array(queries), return_inverse=True)[1]
    diff = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "rank_agreement": rank_agreement(ref[:, 0], cand[:, 0], groups),
    }


ENGINE = EngineSpec(name="text-classification", open=TokenEngine, probe_metrics=probe_metrics)
