"""Decoder coverage: every text-generation family of tests/causal_lms.py built from a tiny
random-weight checkpoint through the pipeline's own steps, in one process.

    python bench/generation_coverage.py [--families llama,gpt2,...] [--no-int4]

Each family: a 2-layer, 64-wide checkpoint (`tests.causal_lms.make_tiny_causal_lm`: the shipped
BPE tokenizer, ChatML) -> export (`export_model`, task text-generation) -> cpu fp32 and cpu int4
(`optimize_model`) -> the gate (`validate_variant` with the task's default thresholds). The
exporter claims that the checkpoint's own modules give every family's positions, attention,
windows and tied embeddings as the family defines them; this table is where that claim is
measured, so each row names the features its family exercises (read from the HF config) beside
the fp32 verdict: greedy continuations of all 16 prompts x 64 tokens must match PyTorch's token
for token on three paths (prefilled at once, in chunks, decoded in one left-padded batch).

int4 on random weights is expected to miss: a random model's next-token distribution is nearly
flat, and the int4 gate is set for trained models (components/core/tasks/text_generation.py).
Its row says whether the graph has MatMulNBits nodes, which recipe the search reached and the
numbers it got; the thresholds are never loosened here. A family that fails is one line in its
row and the run goes on. Writes bench/results/generation_coverage.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("ortpack.generation_coverage")
FP32_VALUES = ("greedy_match", "top1_agreement", "mean_kl", "max_abs_diff", "perplexity_ratio")
GREEDY_PATHS = ("single", "chunked", "batched")
INT4_VALUES = ("top1_agreement", "mean_kl", "perplexity_ratio", "greedy_match")


# ---------------------------------------------------------------- what each family exercises


def positions(config: Any) -> str:
    """rotary (with its share of the head when partial), learned (a table of positions), or ALiBi.
    BLOOM's config names no flag: ALiBi is its only position signal (no table, no rotary)."""
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "alibi", False):
        return "ALiBi"
    if isinstance(rope, dict) and rope:
        share = rope.get("partial_rotary_factor", 1.0)
        return "rotary" if share in (None, 1.0) else f"rotary ({share:g} of each head)"
    for name in ("max_position_embeddings", "n_positions"):
        if getattr(config, name, None):
            return "learned"
    return "ALiBi"


def attention(config: Any) -> tuple[str, int, int]:
    """(MHA / GQA / MQA, query heads, key/value heads) as the config declares them: a
    `multi_query` flag (Falcon's old layout, GPT-BigCode) means one key/value head whatever
    `num_kv_heads` says."""
    heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "n_head", 0))
    kv = getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads", None) or heads
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        kv = 1
    kind = "MQA" if kv == 1 else "MHA" if kv == heads else "GQA"
    return kind, heads, int(kv)


def window(config: Any) -> str:
    """The sliding window and how many layers use it ('-' for none): `layer_types` where the config
    has them (Qwen2 slides from `max_window_layers` on, Gemma alternates), else every layer."""
    size = getattr(config, "sliding_window", None)
    if not size or getattr(config, "use_sliding_window", True) is False:
        return "-"
    layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0))
    types = getattr(config, "layer_types", None)
    sliding = sum(t == "sliding_attention" for t in types) if types else layers
    return f"{size} ({sliding}/{layers} layers)" if sliding else "-"


def features(model_dir: Path) -> dict[str, Any]:
    """The features a checkpoint exercises, from its config.json as transformers reads it."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    kind, heads, kv = attention(config)
    return {
        "positions": positions(config),
        "attention": kind,
        "heads": heads,
        "kv_heads": kv,
        "window": window(config),
        "tied": bool(getattr(config, "tie_word_embeddings", False)),
    }


# ---------------------------------------------------------------- the pipeline's steps


def export_step(model_dir: Path, name: str, out: Path) -> dict[str, Any]:
    """export_model as the pipeline runs it; the step's wall time (the trace, PyTorch's greedy
    reference and the chat template check) beside the trace's own seconds."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    t0 = time.perf_counter()
    export = export_model(ExportSpec(source=str(model_dir), task="text-generation", name=name), out)
    decoder = export.task_settings["decoder"]
    return {
        "export_s": round(time.perf_counter() - t0, 1),
        "trace_s": round(float(export.metrics["seconds"]), 1),
        "nodes": int(export.metrics["nodes"]),
        "exported_kv_heads": decoder["kv_heads"],
        "position_ids_input": decoder["position_ids"],
        "chat_template_checked": export.model_info.get("chat_template_checked"),
        "distinct_greedy_tokens": export.model_info.get("distinct_greedy_tokens"),
    }


def build_variant(export_dir: Path, precision: str, work: Path) -> tuple[Any, Any]:
    """optimize_model then validate_variant with the task's default gate for `precision`."""
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    spec = VariantSpec(target="cpu", precision=precision)
    built = optimize_model(export_dir, spec, work / spec.id)
    report = validate_variant(work / spec.id, export_dir, thresholds_for("text-generation", precision))
    return built, report


def fp32_record(built: Any, report: Any) -> dict[str, Any]:
    """The fp32 verdict: every gated value, and greedy_match on each of the three paths."""
    values = report.values
    return {
        "passed": report.passed,
        "misses": report.misses,
        "nodes_after": built.metrics["nodes_after"],
        **{k: values.get(k) for k in FP32_VALUES},
        "greedy_paths": {path: values.get(f"{path}.greedy_match") for path in GREEDY_PATHS},
        "mean_greedy_match": values.get("mean_greedy_match"),
        "probe_passed": (report.probe or {}).get("passed"),
    }


def int4_record(built: Any, report: Any) -> dict[str, Any]:
    """The int4 graph's weight-only nodes, the recipe the search reached (with the layer groups it
    returned to float, when no recipe was within the gate) and its gate numbers."""
    ops = built.metrics.get("ops_after", {})
    search = built.metrics.get("int4", {})
    return {
        "passed": report.passed,
        "misses": report.misses,
        "matmulnbits": int(ops.get("MatMulNBits", 0)),
        "float_matmuls": int(ops.get("MatMul", 0)),
        "gather_block_quantized": int(ops.get("GatherBlockQuantized", 0)),
        "recipe": search.get("candidate") or search.get("recipe"),
        "search_winner": search.get("recipe"),
        "float_layers": search.get("float_layers", {}),
        "candidates_passed": [n for n, row in search.get("candidates", {}).items() if row.get("passed")],
        **{k: report.values.get(k) for k in INT4_VALUES},
    }


def build_family(model_type: str, work: Path, *, int4: bool) -> dict[str, Any]:
    """One row: the checkpoint's features, the export, fp32 and int4; a failing step is one line
    in the row (`error` for the export, the precision's `error` for a variant) and the rest goes on."""
    from ortpack.components.core.errors import one_line
    from tests.causal_lms import make_tiny_causal_lm

    t0 = time.perf_counter()
    checkpoint = make_tiny_causal_lm(model_type, work / "checkpoint")
    row: dict[str, Any] = {"features": features(checkpoint)}
    try:
        row["export"] = export_step(checkpoint, f"tiny-{model_type.replace('_', '-')}", work / "export")
    except Exception as exc:  # noqa: BLE001 - a failed family is a row of the table, not the end of the run
        row["error"] = f"export: {type(exc).__name__}: {one_line(exc, 300)}"
        return row
    records = {"fp32": fp32_record, "int4": int4_record}
    for precision in ("fp32", "int4") if int4 else ("fp32",):
        try:
            built, report = build_variant(work / "export", precision, work)
            row[precision] = records[precision](built, report)
        except Exception as exc:  # noqa: BLE001
            row[precision] = {"error": f"{type(exc).__name__}: {one_line(exc, 300)}"}
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# ---------------------------------------------------------------- the table


def _fp32_cells(v: dict[str, Any]) -> list[str]:
    """fp32 gate, greedy match (worst path; each path when they differ), KL."""
    if "error" in v:
        return [f"**error**: {v['error'][:100]}", "", ""]
    verdict = "pass" if v["passed"] else "**miss**: " + "; ".join(v["misses"])[:120]
    paths = v["greedy_paths"]
    greedy = f"{v['greedy_match']:.2f}"
    if len(set(paths.values())) > 1:
        greedy += " (" + ", ".join(f"{p} {m:.2f}" for p, m in paths.items()) + ")"
    return [verdict, greedy, f"{v['mean_kl']:.1e}"]


def _int4_cells(v: dict[str, Any] | None) -> list[str]:
    """int4 MatMulNBits count, the recipe reached, the gate's verdict and numbers."""
    if v is None:
        return ["-", "-", "-"]
    if "error" in v:
        return [f"**error**: {v['error'][:100]}", "", ""]
    recipe = v["recipe"] or "-"
    if v["float_layers"]:
        recipe += " (float: " + ", ".join(v["float_layers"]) + ")"
    verdict = "pass" if v["passed"] else "miss (" + "; ".join(v["misses"])[:100] + ")"
    numbers = (
        f"top-1 {v['top1_agreement']:.2f}, KL {v['mean_kl']:.2g}, ppl ×{v['perplexity_ratio']:.3f}, "
        f"greedy {v['greedy_match']:.2f}"
    )
    return [str(v["matmulnbits"]), recipe, f"{verdict}: {numbers}"]


HEADER = (
    "family",
    "positions",
    "attention",
    "window",
    "tied",
    "export s",
    "nodes raw → fp32",
    "fp32 gate",
    "greedy match",
    "KL",
    "int4 MatMulNBits",
    "int4 recipe",
    "int4 gate",
)


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    """One row per family, in the FAMILIES table's order."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for name, row in rows.items():
        f = row["features"]
        attn = f"{f['attention']} {f['heads']}/{f['kv_heads']}"
        cells = [name, f["positions"], attn, f["window"], "yes" if f["tied"] else "no"]
        if "error" in row:
            cells += ["", "", f"**error**: {row['error'][:160]}", *[""] * 5]
        else:
            e, fp32 = row["export"], row.get("fp32", {"error": "not built"})
            cells += [f"{e['export_s']:.1f}", f"{e['nodes']} → {fp32.get('nodes_after', '?')}"]
            cells += [*_fp32_cells(fp32), *_int4_cells(row.get("int4"))]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the run


def versions() -> dict[str, str]:
    import onnxruntime
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def write_results(rows: dict[str, dict[str, Any]], out: Path, argv: list[str]) -> str:
    """generation_coverage.json (when, on what CPU, which versions, every number) and .md (the
    table with a line saying how it was made); returns the table."""
    from bench.serve_load import measured_on

    meta = {
        **measured_on(),
        "versions": versions(),
        "command": " ".join(["python bench/generation_coverage.py", *argv]),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({**meta, "families": rows}, indent=2) + "\n")
    v = meta["versions"]
    table = markdown(rows)
    out.with_suffix(".md").write_text(
        f"Generated by `{meta['command']}` on {meta['measured_at']} ({meta['cpu']}, {meta['cpu_count']} cores; "
        f"torch {v['torch']}, transformers {v['transformers']}, onnxruntime {v['onnxruntime']}). "
        "Tiny random-weight checkpoints (2 layers, 64 wide, tests/causal_lms.py). `export s`: the whole export "
        "step (trace, PyTorch's greedy reference of 16 prompts x 64 tokens, chat template check); greedy match: "
        "the worst of the three paths (single, chunked, batched) over all 16 prompts; KL: mean KL(PyTorch || "
        "variant) per position. int4 on random weights is expected to miss its gate, set for trained models.\n\n"
        f"{table}"
    )
    return table


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # The export's PyTorch latency is not reported here: a few timed calls, not seconds of them
    # (the int4 search's timings, which decide the recipe, are never shortened)
    os.environ.setdefault("ORTPACK_TIMING", "quick")
    from tests.causal_lms import FAMILIES

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help="model_types of tests/causal_lms.py")
    parser.add_argument("--no-int4", action="store_true", help="build cpu fp32 only")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "generation_coverage"), help="path stem")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    for noisy in (
        "ortpack.export",
        "ortpack.optimize",
        "ortpack.validate",
        "ortpack.int4",
        "ortpack.int8",
        "onnxruntime",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    rows: dict[str, dict[str, Any]] = {}
    work_root = Path(tempfile.mkdtemp(prefix="ortpack-generation-coverage-"))
    try:
        for model_type in [f for f in args.families.split(",") if f]:
            log.info("%s: building", model_type)
            rows[model_type] = build_family(model_type, work_root / model_type, int4=not args.no_int4)
            shutil.rmtree(work_root / model_type, ignore_errors=True)
            row = rows[model_type]
            log.info("%s: %s", model_type, row.get("error") or ("fp32 " + _fp32_cells(row["fp32"])[0]))
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    table = write_results(rows, Path(args.out), sys.argv[1:])
    print(table)
    failed = [name for name, row in rows.items() if "error" in row or not row["fp32"].get("passed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
