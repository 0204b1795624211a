"""The text-classification family: a Hugging Face sequence classifier with its activation in the
graph (exporter: components/core/exporters/text_classification.py), token ids to `probabilities`
`[batch, labels]`, or, for a cross-encoder (one output), (query, document) pairs to `scores`
`[batch, 1]`.

Gated on max |diff| of the probabilities (or scores), top-1/top-5 label agreement (classifiers)
and rank agreement within each query's documents (cross-encoders), at batch 1 and at padded
batches of 32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import ortpack.components.core.tasks.text_embedding as text
from ortpack.components.core.quantization.recipes import dynamic_recipe_names
from ortpack.components.core.reference import Reference
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.kernel.contracts.text_classification import CONTRACT
from ortpack.kernel.engine import as_items
from ortpack.kernel.gates import probability_metrics, rank_agreement, topk_overlap
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec
PROBE_ITEMS = 48

# top-1 agreement is gated for classifiers, rank agreement for cross-encoders (each metric is
# measured only for its kind, and a metric not measured is not gated). fp32 is near-exact; int8
# is set from tiny random-weight models (no real checkpoint offline): tighten it for trained ones.
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(GATES, max_abs_diff=1e-4, min_top1_agreement=0.99, min_rank_agreement=0.99),
    "fp16": ParityThresholds.of(GATES, max_abs_diff=5e-3, min_top1_agreement=0.98, min_rank_agreement=0.97),
    "int8": ParityThresholds.of(GATES, min_top1_agreement=0.85, min_rank_agreement=0.85),
}


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.text_classification import export_text_classifier

    return export_text_classifier(spec, out_dir)


def _values(reference: np.ndarray, candidate: np.ndarray, groups: np.ndarray | None) -> dict[str, float]:
    if groups is None:
        return probability_metrics(reference, candidate)
    diff = np.abs(candidate.astype(np.float64) - reference.astype(np.float64))
    return {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "rank_agreement": rank_agreement(reference[:, 0], candidate[:, 0], groups),
    }


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    input_names = [str(n) for n in ref["input_names"]]
    graph_inputs = sorted(i.name for i in session.get_inputs())
    if graph_inputs != sorted(input_names):
        return Comparison(
            values={}, per_item={}, samples=0, misses=[f"inputs are {graph_inputs}, expected {sorted(input_names)}"]
        )
    expected = ref["outputs"].astype(np.float64)
    groups = ref["groups"] if "groups" in ref else None
    raw = {b: text._run(session, ref, input_names, b) for b in (1, text.PADDED_BATCH)}
    nonfinite = sum(int((~np.isfinite(o)).any(axis=1).sum()) for o in raw.values())
    outputs = {b: np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) for b, o in raw.items()}
    values: dict[str, float] = {}
    for batch, out in outputs.items():
        values.update({f"b{batch}.{k}": v for k, v in _values(expected, out, groups).items()})
    for metric in _values(expected, outputs[1], groups):
        pick = max if metric.endswith("diff") else min
        values[metric] = pick(values[f"b{b}.{metric}"] for b in outputs)
    values["batch_max_abs_diff"] = float(np.abs(outputs[1] - outputs[text.PADDED_BATCH]).max())
    values["nonfinite_rows"] = float(nonfinite)
    single = outputs[1]
    per_item = {"prob_diff": [float(d) for d in np.abs(single - expected).max(axis=1)]}
    if groups is None:
        k = min(5, expected.shape[1])
        per_item["topk_overlap"] = [float(o) for o in topk_overlap(expected, single, k)]
    else:  # per query: the share of its document pairs kept in order
        per_query = {
            int(g): rank_agreement(expected[groups == g, 0], single[groups == g, 0], groups[groups == g])
            for g in np.unique(groups)
        }
        per_item["topk_overlap"] = [per_query[int(g)] for g in groups]
    return Comparison(
        values=values,
        per_item=per_item,
        samples=len(expected),
        misses=[f"{nonfinite} outputs contain NaN or inf"] if nonfinite else [],
    )


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """Classifiers: 48 varied texts (as text-embedding picks them). Cross-encoders: whole queries
    (all their documents, so rank agreement is measurable), 48 pairs."""
    ref = Reference.load(export_dir / export.reference_file)
    texts = [str(t) for t in ref["texts"]]
    outputs = ref["outputs"]
    name = export.signature().outputs[0].name
    if "texts_pair" not in ref:
        picked = text.select_indices(texts, ref["lengths"], PROBE_ITEMS)
        inputs = [texts[i] for i in picked]
        return Probe(task=export.task, kind="texts", inputs=inputs, outputs=as_items(name, outputs[picked]))
    pairs = [str(t) for t in ref["texts_pair"]]
    groups = ref["groups"]
    chosen = np.unique(groups)[:: max(1, len(np.unique(groups)) // (PROBE_ITEMS // 8))][: PROBE_ITEMS // 8]
    rows = [i for i in range(len(groups)) if groups[i] in set(chosen.tolist())]
    pairs_in = [(texts[i], pairs[i]) for i in rows]
    return Probe(task=export.task, kind="pairs", inputs=pairs_in, outputs=as_items(name, outputs[rows]))


def _prob_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("max_abs_diff")


FAMILY = TaskFamily(
    name="text-classification",
    description="a Hugging Face sequence classifier or cross-encoder with its activation in the graph",
    resolve_source=text.resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=text.bench_feeds,
    quantize_int8=text.quantize_int8_fixed,
    int8_recipes=dynamic_recipe_names(),
    select_probe=select_probe,
    fuse=text.fuse,
    report=ReportSpec(
        columns=(
            ("max|diff|", "max_abs_diff", ".2g"),
            ("top-1", "top1_agreement", ".3f"),
            ("ranks", "rank_agreement", ".3f"),
        ),
        distance=("prob_diff", "largest probability (or score) difference to PyTorch, per input", _prob_gate),
        agreement=(
            "topk_overlap",
            5,
            "share of inputs by top-5 labels kept (classifiers) or pair order kept (rerankers)",
        ),
        unit="texts or pairs",
    ),
)
