"""Comparing two sets of vectors of the same inputs: cosine and neighbour agreement row by row,
and retrieval across embedding spaces (new queries against an old index). Used by the
text-embedding family's int8 search and by `bundle diff` / the baseline check (compat.py)."""

from __future__ import annotations

import numpy as np

from ortpack.kernel.gates import cosine_rows, neighbour_overlap


def compare_rows(old: np.ndarray, new: np.ndarray, k: int) -> dict[str, float]:
    """Cosine of old and new vectors of the same texts (min/mean), and neighbour agreement@k
    (the share of each text's k nearest neighbours within the set that the new vectors keep)."""

    cos = cosine_rows(old, new)
    return {
        "texts": float(len(old)),
        "min_cosine": float(cos.min()),
        "mean_cosine": float(cos.mean()),
        "neighbour_agreement": float(neighbour_overlap(old, new, k).mean()),
    }


def top_k(queries: np.ndarray, documents: np.ndarray, k: int) -> np.ndarray:
    """Each query's k most cosine-similar documents (indices, best first; ties by index)."""
    q = _unit(queries)
    d = _unit(documents)
    return np.argsort(-(q @ d.T), axis=1, kind="stable")[:, : min(k, len(documents))]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each query's true top-k that `found` holds."""
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


def cross_space_recall(
    old_queries: np.ndarray, old_documents: np.ndarray, new_queries: np.ndarray, new_documents: np.ndarray, k: int
) -> dict[str, float]:
    """Recall@k against the old bundle's own top-k documents per query: of the old bundle on its
    own (1.0), of new queries searching the old index (cross), and of the new bundle on a
    re-indexed corpus; `recall_ratio` is cross / old."""
    truth = top_k(old_queries, old_documents, k)
    alone = recall(top_k(old_queries, old_documents, k), truth)
    cross = recall(top_k(new_queries, old_documents, k), truth)
    return {
        "recall_old": alone,
        "recall_cross": cross,
        "recall_reindexed": recall(top_k(new_queries, new_documents, k), truth),
        "recall_ratio": cross / alone if alone else 0.0,
    }


def _unit(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
