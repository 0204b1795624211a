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

from ortpack.components.core.artifacts import export_engine
from ortpack.components.core.exporters.families import FAMILIES
from ortpack.components.core.quantization.graph_recipes import fuse_graph, quantize_int8_dynamic
from ortpack.components.core.quantization.int8_search import Candidate, Judged, search, session
from ortpack.components.core.quantization.recipes import (
    DYNAMIC_INT8_RECIPES,
    PER_CHANNEL,
    PINNED_RULE,
    DynamicInt8,
    dynamic_recipe,
    dynamic_recipe_names,
)
from ortpack.components.core.reference import Reference
from ortpack.components.core.sources import resolve_checkpoint
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.components.core.timing import synthetic_text_batch, text_bench_shapes
from ortpack.components.core.validation_data import retrieval_queries, validation_sentences
from ortpack.components.core.vectors import compare_rows, cross_space_recall
from ortpack.kernel.contracts.text_embedding import CONTRACT, OUTPUT
from ortpack.kernel.engine import as_items, stack
from ortpack.kernel.gates import cosine_rows, gate, neighbour_overlap
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec
PADDED_BATCH = 32
PROBE_TEXTS = 48

# Measured on all-MiniLM-L6-v2 and a tiny BERT (README, "Parity gate"): fp32 must be near-exact;
# fp16 allows fp16 rounding; int8 is judged mainly on whether each sentence keeps its neighbours.
GATES = CONTRACT.gates
THRESHOLDS = {
    "fp32": ParityThresholds.of(GATES, max_abs_diff=1e-4, min_cosine=0.99999, min_neighbour_agreement=0.99),
    "fp16": ParityThresholds.of(GATES, max_abs_diff=5e-3, min_cosine=0.999, min_neighbour_agreement=0.95),
    "int8": ParityThresholds.of(GATES, min_cosine=0.90, mean_cosine=0.98, min_neighbour_agreement=0.80),
}


def resolve_source(value: str) -> tuple[str, str]:

    return resolve_checkpoint(value)


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.text_embedding import export_text_embedding

    return export_text_embedding(spec, out_dir)


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

    tokenizer = export.task_settings["tokenizer"]
    names = list(tokenizer["model_input_names"])
    return {
        key: (batch, synthetic_text_batch(batch, seq, names, vocab_size=int(export.model_info["vocab_size"])))
        for key, (batch, seq) in text_bench_shapes(int(tokenizer["max_length"])).items()
    }


# The int8 recipe search (components/core/quantization/int8_search.py) judges each candidate on the probe (its
# PyTorch outputs) and a retrieval set: SEARCH_QUERIES shipped queries searching SEARCH_DOCUMENTS
# validation sentences, against the fp32 graph's vectors. Within budget: the int8 gate's cosine
# and neighbour thresholds, and Recall@10 of int8 queries over an int8 index >= SEARCH_MIN_RECALL
# of fp32's own top 10 (all-MiniLM-L6-v2 per-channel: 0.91 on an AMD EPYC with AVX2).
SEARCH_QUERIES, SEARCH_DOCUMENTS, SEARCH_MIN_RECALL, SEARCH_K = 64, 200, 0.85, 10


def quantize_int8_fixed(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> None:
    """Dynamic int8 without a search: the pinned recipe, else 7-bit per-channel weights (the
    search's first recipe); the encoder family says which MatMuls quantize their activations per
    token (`EncoderFamily.int8_per_token`: MPNet's second FFN MatMul)."""

    chosen = dynamic_recipe(recipe) if recipe else PER_CHANNEL
    quantize_int8_dynamic(src, dst, per_token=_per_token(export), recipe=chosen)


def quantize_int8(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> dict[str, Any]:
    """The int8 recipe chosen by search (components/core/quantization/int8_search.py): per-channel, per-tensor
    and FFN-output-in-fp32 weights, each within budget then also with int8 embedding tables; the
    fastest within the parity budget wins (within 10 % is a tie), then the smallest. A pinned
    `recipe` is built alone, unsearched (the validate step gates it)."""
    from dataclasses import replace
    from functools import partial

    if recipe:
        quantize_int8_fixed(src, dst, export, export_dir, recipe)
        return {"recipe": recipe, "rule": PINNED_RULE, "candidates": {}}
    per_token = _per_token(export)
    recipes = {r.name: r for r in DYNAMIC_INT8_RECIPES}

    def candidate(recipe: DynamicInt8) -> Candidate:
        recipes[recipe.name] = recipe
        return Candidate(recipe.name, lambda path: quantize_int8_dynamic(src, path, per_token=per_token, recipe=recipe))

    def smaller(name: str) -> list[Candidate]:
        return [candidate(replace(recipes[name], int8_embeddings=True))]

    judge = _SearchSet.build(src, export, export_dir).judge
    return search(
        [candidate(r) for r in list(recipes.values())],
        dst,
        judge=judge,
        confirm=partial(_whole_gate, Reference.load(export_dir / export.reference_file), export_dir),
        feeds={shape: feeds for shape, (_, feeds) in bench_feeds(export).items()},
        fallback=lambda row: (row.get("recall_at_10", 0.0), row.get("probe_min_cosine", 0.0)),
        expand=smaller,
    )


def _per_token(export: ExportResult) -> tuple[str, ...]:

    family = FAMILIES.get(str(export.model_info.get("model_type", "")))
    return family.int8_per_token if family is not None else ()


class _SearchSet:
    """Token ids and reference vectors of the search's texts: the probe (PyTorch's outputs) and
    the retrieval set (the fp32 graph's outputs), embedded one text per call as int8 is served."""

    def __init__(self, payloads: list[np.ndarray], reference: np.ndarray, probe: int, queries: int) -> None:
        self.payloads, self.reference, self.probe, self.queries = payloads, reference, probe, queries

    @classmethod
    def build(cls, fp32: Path, export: ExportResult, export_dir: Path) -> _SearchSet:

        probe = select_probe(export, export_dir)
        queries = list(dict.fromkeys(t for t in retrieval_queries() if t.strip()))[:SEARCH_QUERIES]
        documents = [t for t in dict.fromkeys(validation_sentences()) if t.strip() and t not in queries]
        texts = queries + documents[:SEARCH_DOCUMENTS]
        # the engine tokenizes as a serving node does (no session: only its tokenizer is used here)
        payloads = export_engine(export, export_dir, None).probe_payloads([str(t) for t in probe.inputs] + texts)
        fp32_rows = _embed_each(_candidate_session(fp32), payloads[len(probe.inputs) :])
        reference = np.concatenate([stack(probe.outputs, OUTPUT).astype(np.float32), fp32_rows])
        return cls(payloads, reference, len(probe.inputs), len(queries))

    def judge(self, path: Path) -> Any:
        """The candidate's numbers and misses; one that misses on the probe is not run further."""

        session, p, q = _candidate_session(path), self.probe, self.probe + self.queries
        thresholds = THRESHOLDS["int8"].as_dict()
        probe = cosine_rows(_embed_each(session, self.payloads[:p]), self.reference[:p]) if p else np.ones(1)
        quality = {"probe_min_cosine": float(probe.min()), "probe_mean_cosine": float(probe.mean())}
        on_probe = {"min_cosine": quality["probe_min_cosine"], "mean_cosine": quality["probe_mean_cosine"]}
        misses = gate(on_probe, thresholds, GATES)
        if misses:
            return Judged(quality=quality, misses=[f"probe: {m}" for m in misses])
        rows = _embed_each(session, self.payloads[p:])
        both = np.concatenate([probe, cosine_rows(rows, self.reference[p:])])
        retrieval = compare_rows(self.reference[p:], rows, SEARCH_K)
        recall = cross_space_recall(self.reference[p:q], self.reference[q:], rows[: q - p], rows[q - p :], SEARCH_K)
        quality |= {
            "min_cosine": float(both.min()),
            "mean_cosine": float(both.mean()),
            "neighbour_agreement": retrieval["neighbour_agreement"],
            "recall_at_10": recall["recall_reindexed"],
            "cross_recall_at_10": recall["recall_cross"],
        }
        misses = gate(quality, thresholds, GATES)
        if quality["recall_at_10"] < SEARCH_MIN_RECALL:
            misses.append(f"recall_at_10 {quality['recall_at_10']:.3f} (needs >= {SEARCH_MIN_RECALL})")
        return Judged(quality=quality, misses=misses)


def _whole_gate(ref: Any, export_dir: Path, path: Path) -> Any:
    """The int8 parity gate as the validate step applies it (`compare`: every validation
    sentence at batch 1 and in padded batches of 32): the search's subset misses what padding
    does to dynamic quantization (all-mpnet-base-v2 at 128 tokens, per channel with int8
    embeddings: min cosine 0.93 at batch 1, 0.83 in the padded batches)."""

    values = compare(_candidate_session(path), ref, export_dir).values
    quality = {f"gate_{k}": values[k] for k in ("min_cosine", "mean_cosine", "neighbour_agreement") if k in values}
    return Judged(quality=quality, misses=THRESHOLDS["int8"].misses(values))


def _candidate_session(path: Path) -> Any:

    return session(path)


def _embed_each(session: Any, payloads: list[np.ndarray]) -> np.ndarray:
    names = {i.name for i in session.get_inputs()}
    rows = []
    for ids in payloads:
        feeds = {"input_ids": ids[None], "attention_mask": np.ones_like(ids)[None]}
        feeds["token_type_ids"] = np.zeros_like(ids)[None]
        rows.append(session.run(None, {k: v for k, v in feeds.items() if k in names})[0][0])
    return np.asarray(rows, dtype=np.float32)


def fuse(raw: Path, export: ExportResult, use_gpu: bool) -> tuple[Any, dict[str, int], str]:
    """The encoder family's fusions (components/core/exporters/families.py)."""

    return fuse_graph(raw, export, use_gpu)


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
    ref = Reference.load(export_dir / export.reference_file)
    texts = [str(t) for t in ref["texts"]]
    picked = select_indices(texts, ref["lengths"])
    rows = as_items(OUTPUT, ref["outputs"][picked])
    return Probe(task=export.task, kind="texts", inputs=[texts[i] for i in picked], outputs=rows)


def retrieval_set() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """400 shipped support-desk questions searching the shipped validation sentences."""

    return retrieval_queries(), validation_sentences()


def _cosine_gate(thresholds: dict[str, float]) -> float | None:
    limit = thresholds.get("min_cosine")
    return None if limit is None else 1 - limit


FAMILY = TaskFamily(
    name="text-embedding",
    description="sentence embeddings from a Hugging Face encoder (pooling and normalisation in the graph)",
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=quantize_int8,
    int8_recipes=dynamic_recipe_names(),
    select_probe=select_probe,
    fuse=fuse,
    retrieval_set=retrieval_set,
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
