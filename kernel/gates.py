"""The parity gate's arithmetic, defined once: how a metric is compared with its threshold
(`Gate`; each task lists its own in its contract, kernel/contracts/<task>.py), and the metrics
themselves.

Used by the pipeline's validate step (against the whole validation set) and by every serving
node's probe check (against the bundle's probe set, before ready), so "passed" means the same
thing at build time and on the node. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Gate:
    """One gated number: the metric a check measures, the threshold that bounds it, and the
    direction (`<=`: a ceiling such as max |diff|; `>=`: a floor such as an agreement)."""

    metric: str
    op: Literal["<=", ">="]
    threshold: str


# threshold name -> its Gate: each task's own table (kernel/contracts/<task>.py)
GateTable = Mapping[str, Gate]


def ceiling(metric: str, threshold: str | None = None) -> Gate:
    """A metric that must stay at or below its threshold (named like the metric unless given)."""
    return Gate(metric=metric, op="<=", threshold=threshold or metric)


def floor(metric: str, threshold: str | None = None) -> Gate:
    """A metric that must reach its threshold (`min_` + the metric unless given)."""
    return Gate(metric=metric, op=">=", threshold=threshold or f"min_{metric}")


def gate_table(*gates: Gate) -> dict[str, Gate]:
    """A task's gates by threshold name, in the order checks and reports list them."""
    table = {g.threshold: g for g in gates}
    if len(table) != len(gates) or len({g.metric for g in gates}) != len(gates):
        raise ValueError(f"a gate table names a metric or threshold twice: {[g.threshold for g in gates]}")
    return table


NEIGHBOURS = 10
# A reference row is decisive when its top class leads the runner-up by at least this much
# probability: a flip between classes PyTorch itself nearly ties (a tabby against a tiger cat at
# 0.379 / 0.376) says nothing about the numerics, and on natural photos half the rows are such.
DECISIVE_MARGIN = 0.1


def gate(values: Mapping[str, float], thresholds: Mapping[str, float | None], gates: GateTable) -> list[str]:
    """Every threshold the values miss, as `metric value (needs op limit)` lines, in the order of
    the task's `gates`. A metric that was not measured is not gated (the probe check measures
    fewer than the full gate)."""
    misses = []
    for field, g in gates.items():
        metric, op = g.metric, g.op
        limit = thresholds.get(field)
        if limit is None or metric not in values:
            continue
        value = float(values[metric])
        ok = value <= limit if op == "<=" else value >= limit
        if not ok or math.isnan(value):
            shown = f"{value:.6g}"
            if shown == f"{limit:g}":  # rounding hides the gap: show enough digits to see it
                shown = repr(value)
            misses.append(f"{metric} {shown} (needs {op} {limit:g})")
    return misses


def margins(values: Mapping[str, float], thresholds: Mapping[str, float | None], gates: GateTable) -> dict[str, float]:
    """Per gated metric, how far the value is on the right side of its threshold (negative: a miss)."""
    out = {}
    for field, g in gates.items():
        metric, op = g.metric, g.op
        limit = thresholds.get(field)
        if limit is None or metric not in values:
            continue
        value = float(values[metric])
        out[metric] = limit - value if op == "<=" else value - limit
    return out


# ---------------------------------------------------------------- embeddings


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    num = (a64 * b64).sum(axis=1)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return num / np.maximum(den, 1e-12)


def nearest_neighbours(emb: np.ndarray, k: int) -> np.ndarray:
    """Indices of each row's `k` most cosine-similar other rows (ties broken by index)."""
    x = emb.astype(np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def neighbour_overlap(reference: np.ndarray, candidate: np.ndarray, k: int = NEIGHBOURS) -> np.ndarray:
    """Per row: the share of its k nearest neighbours (PyTorch) that the candidate keeps."""
    k = min(k, len(reference) - 1)
    if k < 1:
        return np.ones(len(reference))
    ref_nn, cand_nn = nearest_neighbours(reference, k), nearest_neighbours(candidate, k)
    return np.array([len(set(r) & set(c)) / k for r, c in zip(ref_nn, cand_nn, strict=True)])


def embedding_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """max/mean |diff|, min/mean cosine and neighbour agreement of candidate rows vs reference."""
    diff = np.abs(candidate.astype(np.float64) - reference.astype(np.float64))
    cos = cosine_rows(candidate, reference)
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "min_cosine": float(cos.min()),
        "mean_cosine": float(cos.mean()),
        "neighbour_agreement": float(neighbour_overlap(reference, candidate).mean()),
    }


# ---------------------------------------------------------------- class probabilities


def topk_overlap(reference: np.ndarray, candidate: np.ndarray, k: int) -> np.ndarray:
    """Per row: the share of the reference's top-k classes that the candidate's top-k keeps."""
    k = min(k, reference.shape[1])
    a, b = np.argsort(-reference, axis=1)[:, :k], np.argsort(-candidate, axis=1)[:, :k]
    return np.array([len(set(x) & set(y)) / k for x, y in zip(a, b, strict=True)])


def decisive_rows(reference: np.ndarray) -> np.ndarray:
    """Rows whose top class leads the runner-up by DECISIVE_MARGIN or more (a boolean mask)."""
    if reference.shape[1] < 2:
        return np.ones(len(reference), dtype=bool)
    top2 = np.sort(reference, axis=1)[:, -2:]
    return np.asarray((top2[:, 1] - top2[:, 0]) >= DECISIVE_MARGIN)


def probability_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """max/mean |diff| of probabilities, top-1/top-5 agreement of candidate rows vs reference, and
    top-1 agreement on the decisive rows (`decisive_rows`; 1.0 when there are none)."""
    diff = np.abs(candidate.astype(np.float64) - reference.astype(np.float64))
    same = candidate.argmax(1) == reference.argmax(1)
    decisive = decisive_rows(reference)
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "top1_agreement": float(np.mean(same)),
        "top5_agreement": float(topk_overlap(reference, candidate, 5).mean()),
        "decisive_top1_agreement": float(np.mean(same[decisive])) if decisive.any() else 1.0,
        "decisive_rows": float(decisive.sum()),
    }


# ---------------------------------------------------------------- relevance scores


def rank_agreement(reference: np.ndarray, candidate: np.ndarray, groups: np.ndarray) -> float:
    """The share of document pairs, within each query's group, that the candidate orders as the
    reference does (pairs the reference ties are skipped). 1.0: every ranking is the same."""
    agree = total = 0
    for group in np.unique(groups):
        ref, cand = reference[groups == group], candidate[groups == group]
        i, j = np.triu_indices(len(ref), k=1)
        order = np.sign(ref[i] - ref[j])
        keep = order != 0
        agree += int((np.sign(cand[i] - cand[j])[keep] == order[keep]).sum())
        total += int(keep.sum())
    return agree / total if total else 1.0
