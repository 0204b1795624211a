"""The text-embedding family: a Hugging Face encoder with pooling and normalisation in the graph
(exporter: components/core/exporters/text_embedding.py), `input_ids`/`attention_mask`
(/`token_type_ids`) int64 `[batch, sequence]` to `sentence_embedding` float32 `[batch, dim]`.

Gated on max/mean |diff|, min/mean cosine to PyTorch and neighbour agreement (does each sentence
keep its 10 nearest neighbours in the set), at batch 1 and at padded batches of 32.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from components.core.specs import ParityThresholds
from components.core.tasks import Comparison, ReportSpec, TaskFamily
from serving.gates import cosine_rows, neighbour_overlap

if TYPE_CHECKING:
    from components.core.artifacts import ExportResult
    from components.core.specs import ExportSpec
    from serving.probe import Probe

OUTPUT = "sentence_embedding"
PADDED_BATCH = 32
PROBE_TEXTS = 48

# Measured on all-MiniLM-L6-v2 and a tiny BERT (README, "Parity gate"): fp32 must be near-exact;
# fp16 allows fp16 rounding; int8 is judged mainly on whether each sentence keeps its neighbours.
THRESHOLDS = {
    "fp32": ParityThresholds(max_abs_diff=1e-4, min_cosine=0.99999, min_neighbour_agreement=0.99),
    "fp16": ParityThresholds(max_abs_diff=5e-3, min_cosine=0.999, min_neighbour_agreement=0.95),
    "int8": ParityThresholds(min_cosine=0.90, mean_cosine=0.98, min_neighbour_agreement=0.80),
}


def resolve_source(value: str) -> tuple[str, str]:
    from components.core.sources import resolve_checkpoint

    return resolve_checkpoint(value)


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from components.core.exporters.text_embedding import export_text_embedding

    return export_text_embedding(spec, out_dir)


def check_signature(session: Any) -> list[str]:
    misses = []
    for spec in session.get_inputs():
        if spec.type != "tensor(int64)":
            misses.append(f"input {spec.name} is {spec.type}, expected tensor(int64)")
        if len(spec.shape) != 2 or any(isinstance(d, int) for d in spec.shape):
            misses.append(f"input {spec.name} has shape {spec.shape}, expected two dynamic axes")
    outputs = session.get_outputs()
    if len(outputs) != 1 or outputs[0].name != OUTPUT:
        misses.append(f"outputs are {[o.name for o in outputs]}, expected ['{OUTPUT}']")
    elif outputs[0].type != "tensor(float)" or isinstance(outputs[0].shape[0], int):
        misses.append(f"output {OUTPUT} is {outputs[0].type} {outputs[0].shape}, expected float32 [batch, dim]")
    return misses


def _run(session: Any, ref: Any, input_names: list[str], batch: int) -> np.ndarray:
    """Embed every sentence, `batch` at a time in file order, padded to each batch's longest."""
    lengths = ref["lengths"]
    rows = []
    for start in range(0, len(lengths), batch):
        end = min(start + batch, len(lengths))
        width = int(lengths[start:end].max())
        feeds = {name: np.ascontiguousarray(ref[name][start:end, :width]) for name in input_names}
        rows.append(session.run(None, feeds)[0])
    return np.concatenate(rows).astype(np.float32)


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Every sentence at batch 1 (unpadded) and at padded batches of 32; the worst is gated."""
    input_names = [str(n) for n in ref["input_names"]]
    graph_inputs = sorted(i.name for i in session.get_inputs())
    if graph_inputs != sorted(input_names):
        return Comparison(
            values={}, per_item={}, samples=0, misses=[f"inputs are {graph_inputs}, expected {sorted(input_names)}"]
        )
    ref_out = ref["outputs"].astype(np.float64)
    raw = {b: _run(session, ref, input_names, b) for b in (1, PADDED_BATCH)}
    nonfinite = sum(int((~np.isfinite(o)).any(axis=1).sum()) for o in raw.values())
    outputs = {b: np.nan_to_num(o, nan=0.0, posinf=0.0, neginf=0.0) for b, o in raw.items()}
    values: dict[str, float] = {}
    worst_cos = np.ones(len(ref_out))
    for batch, out in outputs.items():
        diff = np.abs(out.astype(np.float64) - ref_out)
        cos = cosine_rows(out, ref_out)
        worst_cos = np.minimum(worst_cos, cos)
        values.update(
            {
                f"b{batch}.max_abs_diff": float(diff.max()),
                f"b{batch}.mean_abs_diff": float(diff.mean()),
                f"b{batch}.min_cosine": float(cos.min()),
                f"b{batch}.mean_cosine": float(cos.mean()),
            }
        )
    batches = sorted(outputs)
    for metric, pick in (("max_abs_diff", max), ("mean_abs_diff", max), ("min_cosine", min), ("mean_cosine", min)):
        values[metric] = pick(values[f"b{b}.{metric}"] for b in batches)
    # Identical token sequences ("", " ", "\t" all tokenize alike) are counted once: their
    # embeddings tie exactly, and a tie broken differently is not a real disagreement.
    _, first_index = np.unique(ref["input_ids"], axis=0, return_index=True)
    dedupe = np.sort(first_index)
    overlaps = {b: neighbour_overlap(ref_out[dedupe], outputs[b][dedupe]) for b in batches}
    for b in batches:
        values[f"b{b}.neighbour_agreement"] = float(overlaps[b].mean())
    values["neighbour_agreement"] = min(values[f"b{b}.neighbour_agreement"] for b in batches)
    values["batch_max_abs_diff"] = float(np.abs(outputs[batches[0]] - outputs[batches[-1]]).max())
    values["nonfinite_rows"] = float(nonfinite)
    # per sentence: the worst cosine over both batch sizes, and the overlaps of the batch size
    # whose mean is the gated neighbour_agreement (so the plotted mean is the gated number)
    worst_batch = min(batches, key=lambda b: values[f"b{b}.neighbour_agreement"])
    return Comparison(
        values=values,
        per_item={
            "cosine_distance": [float(f"{1.0 - c:.4g}") for c in worst_cos],
            "neighbour_overlap": [float(o) for o in overlaps[worst_batch]],
        },
        samples=len(ref_out),
        misses=[f"{nonfinite} outputs contain NaN or inf"] if nonfinite else [],
    )


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """Full batches of random token ids at the shapes PyTorch was timed at (b1×16, b16×128)."""
    from components.core.timing import synthetic_text_batch, text_bench_shapes

    assert export.tokenizer is not None
    names = list(export.tokenizer["model_input_names"])
    return {
        key: (batch, synthetic_text_batch(batch, seq, names, vocab_size=int(export.model_info["vocab_size"])))
        for key, (batch, seq) in text_bench_shapes(int(export.tokenizer["max_length"])).items()
    }


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path) -> None:
    """Dynamic int8, 7-bit per-channel weights; the encoder family says which MatMuls quantize
    their activations per token (`EncoderFamily.int8_per_token`: MPNet's second FFN MatMul)."""
    from components.core.exporters.families import FAMILIES
    from components.core.optimize import quantize_int8_dynamic

    family = FAMILIES.get(str(export.model_info.get("model_type", "")))
    quantize_int8_dynamic(src, dst, per_token=family.int8_per_token if family is not None else ())


def fuse(raw: Path, export: ExportResult, use_gpu: bool) -> tuple[Any, dict[str, int], str]:
    """The encoder family's fusions (components/core/exporters/families.py)."""
    from components.core.optimize import _fuse

    return _fuse(raw, export, use_gpu)


def select_indices(texts: list[str], lengths: np.ndarray, count: int = PROBE_TEXTS) -> list[int]:
    """A varied probe: the longest inputs (truncation), the shortest non-blank ones, non-ASCII
    ones (other scripts, emoji), then evenly spaced others. Blank texts are skipped: the server
    refuses them."""
    usable = [i for i, t in enumerate(texts) if t.strip()]
    by_length = sorted(usable, key=lambda i: (int(lengths[i]), i))
    chosen: dict[int, None] = {}

    def take(candidates: list[int], n: int) -> None:
        for i in candidates:
            if n <= 0 or len(chosen) >= count:
                return
            if i not in chosen and texts[i] not in {texts[j] for j in chosen}:
                chosen[i] = None
                n -= 1

    take(by_length[::-1], count // 8)
    take(by_length, count // 8)
    non_ascii = [i for i in usable if not texts[i].isascii()]
    take(non_ascii[:: max(1, len(non_ascii) // (count // 4))], count // 4)
    rest = [i for i in usable if i not in chosen]
    take(rest[:: max(1, len(rest) // count)], count - len(chosen))
    return sorted(chosen)


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    from serving.probe import Probe

    with np.load(export_dir / export.reference_file, allow_pickle=False) as ref:
        texts = [str(t) for t in ref["texts"]]
        picked = select_indices(texts, ref["lengths"])
        return Probe(task=export.task, inputs=[texts[i] for i in picked], outputs=ref["outputs"][picked])


def _cosine_gate(thresholds: dict[str, float]) -> float | None:
    limit = thresholds.get("min_cosine")
    return None if limit is None else 1 - limit


FAMILY = TaskFamily(
    name="text-embedding",
    description="sentence embeddings from a Hugging Face encoder (pooling and normalisation in the graph)",
    options=frozenset({"max_length"}),
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    check_signature=check_signature,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=quantize_int8,
    select_probe=select_probe,
    fuse=fuse,
    report=ReportSpec(
        columns=(
            ("max|diff|", "max_abs_diff", ".2g"),
            ("min cos", "min_cosine", ".5f"),
            ("neighbours", "neighbour_agreement", ".3f"),
        ),
        distance=("cosine_distance", "1 - cosine similarity to PyTorch, per sentence", _cosine_gate),
        agreement=(
            "neighbour_overlap",
            10,
            "share of sentences by how many of their 10 nearest neighbours (PyTorch) the variant keeps",
        ),
        unit="sentences",
    ),
)
