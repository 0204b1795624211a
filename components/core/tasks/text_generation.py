"""The text-generation family: a Hugging Face causal language model as one decoder step with its
key/value cache (exporter: components/core/exporters/text_generation.py; tensors:
kernel/contracts/text_generation.py), served by the generation engine (kernel/generation/).

Gated against PyTorch on the shipped prompts, through the code that serves: the variant's
next-token distributions along PyTorch's greedy continuations (teacher-forced: top-1 agreement,
KL, log-probability differences), its own greedy continuations (prefilled at once, in chunks, and
decoded in a left-padded batch of every prompt: each must match PyTorch's token for token as far
as the precision's gate asks), and its perplexity on a shipped text against PyTorch's.

Precisions: fp32; int8 and int4 are weight-only (`MatMulNBits`, components/core/quantization/
weight_only.py): int8 with one recipe, int4 chosen by search (block size and accuracy level by
measurement and by the gate; the costliest layers back in float when it misses).

What random weights can and cannot prove (no trained causal LM installs here): fp32 parity and
the cache, padding, chunking and position plumbing are checked exactly, since a tiny random model's
greedy continuation is as deterministic as a trained one's; whether int4 or int8 keeps a trained
model's quality is not, because a random model's next-token distribution is nearly flat and far
more fragile than a trained one's. The int8 and int4 thresholds are set for trained models (the
literature: RTN int4 with 32-wide blocks adds ~5-10 % perplexity to 0.5-1B models).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.graph_files import save_graph
from ortpack.components.core.quantization.int8_search import Candidate, Judged, search
from ortpack.components.core.quantization.int8_search import session as candidate_session
from ortpack.components.core.quantization.weight_only import (
    EMBEDDINGS,
    Judgement,
    WeightOnly,
    keep_costliest,
    layer_groups,
)
from ortpack.components.core.quantization.weight_only import quantize_weight_only as quantize_weight_only_graph
from ortpack.components.core.reference import Reference
from ortpack.components.core.sources import resolve_checkpoint
from ortpack.components.core.specs import ParityThresholds
from ortpack.components.core.tasks.family import Comparison, ReportSpec, TaskFamily
from ortpack.components.core.timing import decoder_bench_shapes
from ortpack.kernel.contracts.text_generation import (
    ATTENTION_MASK,
    CONTRACT,
    INPUT_IDS,
    LOGITS_TO_KEEP,
    POSITION_IDS,
    TextGenerationSettings,
    cache_names,
    distribution_metrics,
    greedy_metrics,
    log_softmax,
    past_name,
)
from ortpack.kernel.engines.text_generation import CONTINUATION
from ortpack.kernel.generation.cache import DecodeBatch, Joining
from ortpack.kernel.generation.decoder import Decoder
from ortpack.kernel.probe import Probe

if TYPE_CHECKING:
    from ortpack.components.core.specs import ExportSpec

log = logging.getLogger("ortpack.int4")

# every serving node replays these at start-up: 256 positions, so that a top-1 agreement of 0.83 on
# the whole gate does not read below 0.8 by chance (its standard error at 128 positions was 0.033)
PROBE_SEQUENCES, PROBE_TOKENS = 8, 32
CHUNK = 5  # the chunked-prefill path's chunk (odd, so chunks end mid-word)
SEARCH_PROMPTS = 6  # the int4 search judges candidates on this many prompts (teacher-forced)

GATES = CONTRACT.gates
# fp32 must match PyTorch token for token over all 64 greedy tokens of every prompt; its
# distributions differ only by float rounding (measured on 17 tiny families, bench/results/
# generation_coverage.md: mean KL 1e-7 to 7e-7 against the reference's float32 log-probabilities,
# max |diff| of log-probabilities < 1e-4). int8 and int4 are set for trained models (see above).
THRESHOLDS = {
    "fp32": ParityThresholds.of(
        GATES, min_top1_agreement=0.99, mean_kl=1e-5, max_abs_diff=1e-3, min_greedy_match=1.0, perplexity_ratio=1.001
    ),
    "int8": ParityThresholds.of(GATES, min_top1_agreement=0.9, mean_kl=0.02, perplexity_ratio=1.02),
    "int4": ParityThresholds.of(GATES, min_top1_agreement=0.8, mean_kl=0.1, perplexity_ratio=1.15),
}


def resolve_source(value: str) -> tuple[str, str]:
    return resolve_checkpoint(value)


def export(spec: ExportSpec, out_dir: Path) -> ExportResult:
    from ortpack.components.core.exporters.text_generation import export_text_generation

    return export_text_generation(spec, out_dir)


# ---------------------------------------------------------------- the reference, as the gate reads it


class GenerationReference:
    """The export's reference.npz for one decoder: prompts, PyTorch's greedy continuations, its
    teacher-forced top log-probabilities along them, and the perplexity text."""

    def __init__(self, ref: Reference) -> None:
        self.prompts = [p.tolist() for p in np.split(ref["prompt_ids"], ref["prompt_ends"][:-1])]
        self.continuations = [np.asarray(c, np.int64) for c in ref["continuations"]]
        length = len(self.continuations[0])
        self.top_ids = ref["top_ids"].reshape(len(self.prompts), length, -1)
        self.top_logp = ref["outputs"].reshape(len(self.prompts), length, -1)
        self.perplexity_ids = ref["perplexity_ids"].tolist()
        self.perplexity = float(ref["perplexity"])


def teacher_forced_values(decoder: Decoder, reference: GenerationReference, prompts: int | None = None) -> dict:
    """Next-token distributions along PyTorch's continuations, and the perplexity ratio."""
    rows = range(len(reference.prompts) if prompts is None else min(prompts, len(reference.prompts)))
    logits = np.concatenate(
        [decoder.teacher_forced(reference.prompts[i], reference.continuations[i].tolist()) for i in rows]
    )
    top_ids = np.concatenate([reference.top_ids[i] for i in rows])
    top_logp = np.concatenate([reference.top_logp[i] for i in rows])
    values = distribution_metrics(top_ids, top_logp, logits)
    ids = reference.perplexity_ids
    logp = log_softmax(decoder.prefill(ids, keep=len(ids)).logits[0, :-1])
    ppl = float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))
    values["perplexity"] = ppl
    values["perplexity_ratio"] = ppl / reference.perplexity
    return values


def batched_greedy(decoder: Decoder, prompts: list[list[int]], count: int) -> list[np.ndarray]:
    """Greedy continuations of every prompt decoded together, as the server's loop runs them: each
    prompt prefilled alone, then all in one left-padded batch (rows of different lengths)."""
    batch = DecodeBatch(decoder)
    joining, first = [], []
    for key, prompt in enumerate(prompts):
        out = decoder.prefill(prompt)
        joining.append(Joining(key=key, cache=out.present, position=len(prompt)))
        first.append(int(np.argmax(out.logits[0, -1])))
    batch.rebuild([], joining)
    tokens = [[t] for t in first]
    for _ in range(count - 1):
        logits = batch.step(np.array([row[-1] for row in tokens]))
        for row, token in zip(tokens, logits.argmax(axis=1), strict=True):
            row.append(int(token))
    return [np.array(row, np.int64) for row in tokens]


def compare(session: Any, ref: Any, export_dir: Path) -> Comparison:
    """Teacher-forced distributions and perplexity on every prompt; greedy continuations prefilled
    at once (every prompt), in chunks of CHUNK (the first four) and decoded as one batch (every
    prompt): `greedy_match` is the worst of the three."""
    settings = ExportResult.load(export_dir).settings()
    assert isinstance(settings, TextGenerationSettings)
    decoder = Decoder(session, settings.decoder)
    reference = GenerationReference(ref)
    values = teacher_forced_values(decoder, reference)
    count = len(reference.continuations[0])
    single = [decoder.greedy(p, count) for p in reference.prompts]
    chunked = [decoder.greedy(p, count, chunk=CHUNK) for p in reference.prompts[:4]]
    batched = batched_greedy(decoder, reference.prompts, count)
    paths = {
        "single": greedy_metrics(reference.continuations, single),
        "chunked": greedy_metrics(reference.continuations[:4], chunked),
        "batched": greedy_metrics(reference.continuations, batched),
    }
    for path, metrics in paths.items():
        values.update({f"{path}.{k}": v for k, v in metrics.items()})
    values["greedy_match"] = min(m["greedy_match"] for m in paths.values())
    values["mean_greedy_match"] = float(np.mean([m["mean_greedy_match"] for m in paths.values()]))
    matched = [greedy_metrics([r], [c])["greedy_match"] for r, c in zip(reference.continuations, single, strict=True)]
    per_prompt_kl = [
        distribution_metrics(
            reference.top_ids[i],
            reference.top_logp[i],
            decoder.teacher_forced(reference.prompts[i], reference.continuations[i].tolist()),
        )["mean_kl"]
        for i in range(len(reference.prompts))
    ]
    return Comparison(
        values=values,
        per_item={"kl": [float(f"{k:.4g}") for k in per_prompt_kl], "greedy_match": matched},
        samples=len(reference.prompts),
    )


def select_probe(export: ExportResult, export_dir: Path) -> Probe:
    """PROBE_SEQUENCES prompts of different lengths with PyTorch's first PROBE_TOKENS greedy tokens."""
    reference = GenerationReference(Reference.load(export_dir / export.reference_file))
    order = np.argsort([len(p) for p in reference.prompts], kind="stable")
    picked = order[np.linspace(0, len(order) - 1, PROBE_SEQUENCES).round().astype(int)]
    inputs = [(np.asarray(reference.prompts[i], np.int64), reference.continuations[i][:PROBE_TOKENS]) for i in picked]
    outputs = [{CONTINUATION: continuation} for _, continuation in inputs]
    return Probe(task=export.task, kind="sequences", inputs=inputs, outputs=outputs)


# ---------------------------------------------------------------- benchmarks


def bench_inputs(batch: int, new: int, past: int, settings: Any, vocab: int) -> dict[str, np.ndarray]:
    """Random token ids and a random cache of one benchmark shape, as the graph takes them
    (`settings`: the manifest's decoder section, as a dict or the model)."""
    d = settings if isinstance(settings, dict) else settings.model_dump()
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {
        INPUT_IDS.name: rng.integers(0, vocab, (batch, new), dtype=np.int64),
        ATTENTION_MASK.name: np.ones((batch, past + new), np.int64),
        LOGITS_TO_KEEP.name: np.array([1], np.int64),
    }
    if d.get("position_ids", True):
        feeds[POSITION_IDS.name] = np.broadcast_to(np.arange(past, past + new, dtype=np.int64), (batch, new)).copy()
    for i, kind in cache_names(int(d["layers"])):
        shape = (batch, int(d["kv_heads"]), past, int(d["head_dim"]))
        feeds[past_name(i, kind)] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """Per benchmark shape: the batch (sequences; a decode step's tokens) and the graph's feeds."""
    settings = export.task_settings
    decoder, vocab = settings["decoder"], int(settings["decoder"]["vocab_size"])
    return {
        key: (batch, bench_inputs(batch, new, past, decoder, vocab))
        for key, (batch, new, past) in decoder_bench_shapes(int(settings["tokenizer"]["max_length"])).items()
    }


# ---------------------------------------------------------------- weight-only int8 and int4


def _decode_feeds(export: ExportResult) -> dict[str, dict[str, np.ndarray]]:
    """The decode shapes (what weight-only quantization is for) the search times candidates on."""
    return {shape: feeds for shape, (_, feeds) in bench_feeds(export).items() if shape.startswith("decode")}


# int8 weights in blocks of 128 or 32, int8 compute. Measured on the Qwen2-0.5B shape (2 cores, AVX-512
# VNNI), decode tokens/s at batch 1: blocks of 128 37.8, of 32 34.5; dynamic int8 (MatMulInteger) 26.0,
# fp32 15.1. Float compute (accuracy level 0) halved int4's speed, so int8 is not offered it.
INT8_CANDIDATES = tuple(WeightOnly(bits=8, block_size=block, accuracy_level=4) for block in (128, 32))


CANDIDATES = {
    "int8": INT8_CANDIDATES,
    "int4": tuple(WeightOnly(bits=4, block_size=b, accuracy_level=level) for b in (32, 128) for level in (4, 0)),
}
INT8_FIELDS = ("recipe", "candidate", "rule", "candidates")  # what the manifest's int8 record holds


def quantize_weight_only(
    src: Path,
    dst: Path,
    export: ExportResult,
    export_dir: Path,
    precision: str,
    thresholds: ParityThresholds,
    recipe: str | None,
) -> dict[str, Any]:
    """int8 or int4 weights (`MatMulNBits`) by search (`_search`) against the build's gate; a pinned
    `recipe` (a candidate's name, such as int8-b128-a4) is built alone."""
    if recipe:
        chosen = next((r for r in CANDIDATES[precision] if r.name == recipe), None)
        if chosen is None:
            known = ", ".join(r.name for r in CANDIDATES[precision])
            raise ValueError(f"unknown {precision} recipe {recipe!r} for text-generation (known: {known})")
        quantize_weight_only_graph(src, dst, chosen, save_graph)
        return {"recipe": chosen.name, "rule": "pinned", "candidates": {}, **_describe(chosen, precision)}
    return _search(src, dst, export, export_dir, CANDIDATES[precision], precision, thresholds)


def _search(
    src: Path,
    dst: Path,
    export: ExportResult,
    export_dir: Path,
    candidates: tuple[WeightOnly, ...],
    precision: str,
    thresholds: ParityThresholds,
) -> dict[str, Any]:
    """Each candidate judged teacher-forced on SEARCH_PROMPTS prompts against PyTorch with the
    precision's gate; those within it timed on the decode shapes and the fastest kept (ties to the
    smaller: components/core/quantization/int8_search.py), then tried with the embedding table
    quantized too. When none is within the gate, the nearest goes on with its costliest layer
    groups back in float until it is (`keep_costliest`)."""
    reference = GenerationReference(Reference.load(export_dir / export.reference_file))
    settings = export.settings()
    assert isinstance(settings, TextGenerationSettings)

    def judge_path(path: Path) -> Judgement:
        decoder = Decoder(candidate_session(path), settings.decoder)
        values = teacher_forced_values(decoder, reference, SEARCH_PROMPTS)
        return Judgement(values=values, misses=thresholds.misses(values))

    def judged(path: Path) -> Judged:
        j = judge_path(path)
        quality = {k: j.values[k] for k in ("top1_agreement", "mean_kl", "perplexity_ratio")}
        return Judged(quality=quality, misses=j.misses)

    def build(recipe: WeightOnly, path: Path) -> None:
        quantize_weight_only_graph(src, path, recipe, save_graph)

    recipes = {r.name: r for r in candidates}

    def candidate(recipe: WeightOnly) -> Candidate:
        recipes[recipe.name] = recipe
        return Candidate(recipe.name, partial(build, recipe))

    def with_embeddings(name: str) -> list[Candidate]:
        return [candidate(replace(recipes[name], embeddings=True))]

    record = search(
        [candidate(r) for r in candidates],
        dst,
        judge=judged,
        feeds=_decode_feeds(export),
        fallback=lambda q: -q.get("mean_kl", np.inf),
        expand=with_embeddings,
        precision=precision,
    )
    chosen = recipes[record["recipe"]]
    if not any(row["passed"] for row in record["candidates"].values()):
        log.warning("%s: no recipe is within the gate; returning the costliest layers to float", precision)
        groups = [g for g in layer_groups(_load(src)) if g != EMBEDDINGS]
        reached, costs, tried = keep_costliest(
            chosen, groups, build, judge_path, lambda j: j.values["mean_kl"], dst.parent
        )
        build(reached, dst)
        record = {
            **record,
            "candidate": reached.name,
            "candidates": {**record["candidates"], **tried},
            "float_layers": {g: costs[g] for g in reached.keep_float},
            "sensitivity": costs,
        }
        chosen = reached
    if precision == "int8":
        return {k: record[k] for k in INT8_FIELDS if k in record} | _describe(chosen, precision)
    return {**record, **_describe(chosen, precision)}


def _describe(recipe: WeightOnly, precision: str) -> dict[str, Any]:
    """What the manifest records of the chosen recipe (the int8 record has room for its width only)."""
    if precision == "int8":
        return {"weight_bits": 8}
    return {
        "bits": recipe.bits,
        "block_size": recipe.block_size,
        "accuracy_level": recipe.accuracy_level,
        "embeddings": recipe.embeddings,
    }


def _load(path: Path) -> Any:
    import onnx

    return onnx.load(str(path), load_external_data=False)


def speed_rows(export: ExportResult, records: Sequence[Any]) -> list[list[str]]:
    """The report's speed table: per engine (PyTorch eager at export, each variant at benchmark),
    the prompt's prefill (time to first token, prompt tokens/s), decode tokens/s at batch 1 and 8,
    weights on disk; the cache each token holds is the same for all (fp32)."""
    shapes = decoder_bench_shapes(int(export.task_settings["tokenizer"]["max_length"]))
    prefill, one, eight = list(shapes)
    prompt = shapes[prefill][1]
    kv = TextGenerationSettings.model_validate({**export.task_settings, "task": export.task}).decoder
    header = [
        "engine",
        f"time to first token ({prompt} tokens)",
        "prefill tokens/s",
        "decode tokens/s, 1 sequence",
        "decode tokens/s, 8 sequences",
        "weights MB",
        "cache per token",
    ]
    rows = [header]

    def row(name: str, stats: dict[str, dict[str, float]], mb: float) -> list[str]:
        def ms(shape: str) -> float | None:
            return stats[shape]["p50_ms"] if shape in stats else None

        cells = [name]
        first = ms(prefill)
        cells += [f"{first:.0f} ms" if first else "-", f"{prompt * 1000 / first:.0f}" if first else "-"]
        for shape, batch in ((one, 1), (eight, 8)):
            step = ms(shape)
            cells.append(f"{batch * 1000 / step:.1f}" if step else "-")
        return [*cells, f"{mb:.0f}", f"{kv.kv_bytes_per_token / 1024:.1f} KiB"]

    rows.append(row("pytorch (eager)", export.torch_latency, float(export.metrics.get("mb", 0.0))))
    for rec in records:
        if rec.benchmark is not None:
            rows.append(row(rec.variant_id, rec.benchmark.shapes, float(rec.built.metrics["mb"])))
    return rows


def _not_weight_only(src: Path, dst: Path, export: ExportResult, export_dir: Path, recipe: str | None) -> None:
    raise TypeError("a decoder quantizes weights only: the optimize step calls quantize_weight_only")


def _kl_gate(thresholds: dict[str, float]) -> float | None:
    return thresholds.get("mean_kl")


FAMILY = TaskFamily(
    name="text-generation",
    description="a Hugging Face causal language model with its key/value cache, served by the generation engine",
    resolve_source=resolve_source,
    export=export,
    thresholds=THRESHOLDS,
    compare=compare,
    bench_feeds=bench_feeds,
    quantize_int8=_not_weight_only,
    quantize_weight_only=quantize_weight_only,
    int8_recipes=tuple(r.name for r in INT8_CANDIDATES),
    select_probe=select_probe,
    report=ReportSpec(
        columns=(
            ("top-1", "top1_agreement", ".3f"),
            ("KL", "mean_kl", ".2g"),
            ("greedy", "greedy_match", ".2f"),
            ("ppl ratio", "perplexity_ratio", ".3f"),
        ),
        distance=("kl", "KL(PyTorch || variant) per prompt, mean over its continuation", _kl_gate),
        agreement=("greedy_match", 1, "share of each greedy continuation matching PyTorch's from the start"),
        unit="prompts",
        speed=speed_rows,
    ),
)
