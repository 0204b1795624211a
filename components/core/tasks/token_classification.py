"""The token-classification family: a Hugging Face token classifier (named-entity recognition,
part-of-speech tagging) with softmax in the graph (exporter:
components/core/exporters/token_classification.py), token ids to `probabilities`
`[batch, sequence, labels]`.

Gated on max |diff| of the per-token probabilities and on token-label agreement (the share of
real tokens whose label is kept; also on the decisive tokens alone), at batch 1 and at padded
batches of 32. The contract (its section and gate table) is kernel/contracts/token_classification.py.
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
from ortpack.kernel.contracts.token_classification import CONTRACT, OUTPUT, PAD, token_metrics
from ortpack.kernel.engine import as_items
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec
PROBE_ITEMS = 48

# fp32 is near-exact; int8 is set from a trained MiniLM trunk with a seeded head and tiny random
# models (no trained token classifier ships on the package index): tighten it for your model
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(GATES, max_abs_diff=1e-4, min_token_agreement=0.999),
    "fp16": ParityThresholds.of(GATES, max_abs_diff=5e-3, min_token_agreement=0.99),
    "int8": ParityThresholds.of(GATES, min_token_agreement=0.85, min_decisive_token_agreement=0.9),
}


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.token_classification import export_token_classifier

    return export_token_classifier(spec, out_dir)


def _run(session: Any, ref: Any, input_names: list[str], batch: int, width: int) -> np.ndarray:
    """Every text, `batch` at a time in file order, padded to each batch's longest; rows padded
    with PAD past each text's tokens to `width`, as the reference is."""
    lengths = ref["lengths"]
    out = np.full((len(lengths), width, ref["outputs"].shape[-1]), PAD, dtype=np.float32)
    for start in range(0, len(lengths), batch):
        end = min(start + batch, len(lengths))
        longest = int(lengths[start:end].max())
        feeds = {name: np.ascontiguousarray(ref[name][start:end, :longest]) for name in input_names}
        probs = session.run(None, feeds)[0]
        for row, i in enumerate(range(start, end)):
            out[i, : int(lengths[i])] = probs[row, : int(lengths[i])]
    return out


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    input_names = [str(n) for n in ref["input_names"]]
    graph_inputs = sorted(i.name for i in session.get_inputs())
    if graph_inputs != sorted(input_names):
        return Comparison(
            values={}, per_item={}, samples=0, misses=[f"inputs are {graph_inputs}, expected {sorted(input_names)}"]
        )
    expected = ref["outputs"]
    width = expected.shape[1]
    raw = {b: _run(session, ref, input_names, b, width) for b in (1, text.PADDED_BATCH)}
    nonfinite = sum(int((~np.isfinite(o)).any(axis=(1, 2)).sum()) for o in raw.values())
    outputs = {b: np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) for b, o in raw.items()}
    values: dict[str, float] = {}
    for batch, out in outputs.items():
        values.update({f"b{batch}.{k}": v for k, v in token_metrics(expected, out).items()})
    for metric in token_metrics(expected, outputs[1]):
        pick = max if metric.endswith("diff") else min
        values[metric] = pick(values[f"b{b}.{metric}"] for b in outputs)
    real = expected[..., 0] != PAD
    values["batch_max_abs_diff"] = float(np.abs(outputs[1] - outputs[text.PADDED_BATCH])[real].max())
    values["nonfinite_rows"] = float(nonfinite)
    single = outputs[1]
    per_item: dict[str, list[float]] = {"prob_diff": [], "token_agreement": []}
    for i in range(len(expected)):
        n = int(real[i].sum())
        ref_i, got_i = expected[i, :n].astype(np.float64), single[i, :n].astype(np.float64)
        per_item["prob_diff"].append(float(np.abs(got_i - ref_i).max()))
        per_item["token_agreement"].append(float((got_i.argmax(1) == ref_i.argmax(1)).mean()))
    return Comparison(
        values=values,
        per_item=per_item,
        samples=len(expected),
        misses=[f"{nonfinite} outputs contain NaN or inf"] if nonfinite else [],
    )


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """48 varied texts (as text-embedding picks them) with their per-token probabilities."""
    ref = Reference.load(export_dir / export.reference_file)
    texts = [str(t) for t in ref["texts"]]
    picked = text.select_indices(texts, ref["lengths"], PROBE_ITEMS)
    rows = as_items(OUTPUT, ref["outputs"][picked])
    return Probe(task=export.task, kind="texts", inputs=[texts[i] for i in picked], outputs=rows)


def _prob_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("max_abs_diff")


FAMILY = TaskFamily(
    name=CONTRACT.name,
    description="a Hugging Face token classifier (NER, tagging) with softmax per token in the graph",
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
            ("tokens", "token_agreement", ".3f"),
            ("decisive", "decisive_token_agreement", ".3f"),
        ),
        distance=("prob_diff", "largest per-token probability difference to PyTorch, per text", _prob_gate),
        agreement=("token_agreement", 1, "share of each text's tokens whose label is kept"),
        unit="texts",
    ),
)
