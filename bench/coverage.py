"""Architecture coverage: every supported encoder family built from a tiny random-weight config,
plus the real all-MiniLM-L6-v2, through the pipeline's own steps.

    python bench/coverage.py [--families bert,roberta,...] [--no-minilm] [--budget 1.0]
    python bench/coverage.py --survey [--families ...]

`--survey` is how each family's exporter and fuser were chosen: every family (by default those
whose record in families.py is not the BERT pair) at MiniLM's size (6 layers, 384 wide, random
weights) with each pair, TorchScript + ORT's BERT fusions, TorchScript + the onnxscript fusions and
dynamo + the onnxscript fusions, written to bench/results/family_survey.{json,md}.

Each family: a 2-layer, 64-wide checkpoint (`tests.models.make_tiny_encoder`: MiniLM's tokenizer,
no sentence-transformers config, so the exporter's defaults apply) -> export -> cpu fp32 and
int8 (optimize, validate against the gate, benchmark). Encoder-decoders and an unknown model_type
are tried too, and must be refused. Writes bench/results/coverage.json and coverage.md (the
table the README shows). Latency is b1x16 p50 on this machine: PyTorch eager from the export step,
each variant as the server loads it. Tiny models' latency is mostly per-operator overhead; the
MiniLM row is the realistic one.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("ortpack.coverage")
SHAPE = "b1_s16"
REFUSED = ("t5", "bart", "gpt2", "made_up_encoder")


def _load_stats(measurements: Any) -> dict[str, float]:
    """`load_*` of the most loaded of these measurements (timing.LoadRecord); {} if none recorded."""
    from ortpack.components.core.timing import load_of

    load = load_of(measurements)
    return load.as_stats() if load else {}


def build_family(model_dir: Path, name: str, work: Path, budget: float) -> dict[str, Any]:
    """Export `model_dir`, then build, validate and benchmark cpu fp32 and int8; one record."""
    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.benchmark import benchmark_variant
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for

    row: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        export = export_model(ExportSpec(source=str(model_dir), task="text-embedding", name=name), work / "export")
    except Exception as exc:  # noqa: BLE001 - a failed family is a row of the table, not the end of the run
        return {"builds": False, "error": f"export: {type(exc).__name__}: {exc}"}
    export = ExportResult.load(work / "export")
    assert export.task_settings["tokenizer"] is not None
    row.update(
        exporter=export.model_info.get("exporter"),
        opset=export.opset,
        inputs=[i["name"] for i in export.inputs],
        max_length=export.task_settings["tokenizer"]["max_length"],
        nodes_raw=int(export.metrics["nodes"]),
        reference_spread=export.metrics.get("reference_spread"),
        torch_p50_ms=export.torch_latency[SHAPE]["p50_ms"],
        torch_p50_ms_by_shape={shape: stats["p50_ms"] for shape, stats in export.torch_latency.items()},
        torch_load=_load_stats(export.torch_latency.values()),
    )
    variants: dict[str, Any] = {}
    for precision in ("fp32", "int8"):
        spec = VariantSpec(target="cpu", precision=precision)
        vdir = work / spec.id
        try:
            built = optimize_model(work / "export", spec, vdir)
            parity = validate_variant(vdir, work / "export", thresholds_for("text-embedding", precision))
        except Exception as exc:  # noqa: BLE001
            variants[precision] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        record: dict[str, Any] = {
            "nodes_before": built.metrics["nodes_before"],
            "nodes_after": built.metrics["nodes_after"],
            "fuser": built.metrics.get("fuser"),
            "fusions": built.metrics["fusions"],
            "passed": not parity.misses,
            "misses": parity.misses,
            "gate": {k: parity.values[k] for k in ("max_abs_diff", "min_cosine", "mean_cosine", "neighbour_agreement")},
        }
        if not parity.misses:
            bench = benchmark_variant(vdir, work / "export", budget_s=budget)
            record["p50_ms"] = bench.shapes[SHAPE]["p50_ms"]
            record["speedup_vs_torch"] = bench.speedup_vs_torch.get(SHAPE)
            record["p50_ms_by_shape"] = {shape: stats["p50_ms"] for shape, stats in bench.shapes.items()}
            record.update(_load_stats(bench.shapes.values()))
        variants[precision] = record
    row["variants"] = variants
    row["builds"] = "error" not in variants.get("fp32", {"error": ""}) and bool(variants["fp32"].get("passed"))
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


SURVEY_PAIRS = (("torchscript", "ort-bert"), ("torchscript", "onnxscript"), ("dynamo", "onnxscript"))


def survey(families: list[str], work_root: Path, budget: float) -> dict[str, dict[str, Any]]:
    """Each family at MiniLM's size with every exporter + fuser pair (the families table patched
    for the run, as the exporter and optimize step read it); one row per family and pair."""
    import dataclasses

    from ortpack.components.core.exporters import families as table
    from tests.models import make_tiny_encoder

    rows: dict[str, dict[str, Any]] = {}
    for model_type in families:
        chosen = table.FAMILIES[model_type]
        checkpoint = make_tiny_encoder(
            model_type, work_root / model_type / "checkpoint", max_position=512, size="minilm"
        )
        for exporter, fuser in SURVEY_PAIRS:
            name = f"{model_type} {exporter} + {fuser}"
            log.info("%s: building", name)
            table.FAMILIES[model_type] = dataclasses.replace(chosen, exporter=exporter, fuser=fuser)
            try:
                work = work_root / model_type / f"{exporter}-{fuser}"
                rows[name] = build_family(checkpoint, f"survey-{model_type.replace('_', '-')}", work, budget)
                rows[name]["chosen"] = (chosen.exporter, chosen.fuser) == (exporter, fuser)
                shutil.rmtree(work, ignore_errors=True)
            finally:
                table.FAMILIES[model_type] = chosen
    return rows


def refusal(model_type: str, work: Path) -> dict[str, Any]:
    """What the exporter says about a checkpoint of an unsupported model_type (config only)."""
    from ortpack.components.core.errors import OrtpackError
    from ortpack.components.core.export import export_model
    from ortpack.components.core.specs import ExportSpec

    model_dir = work / model_type
    model_dir.mkdir(parents=True)
    config: dict[str, Any] = {"model_type": model_type}
    if model_type in ("t5", "bart"):
        config["is_encoder_decoder"] = True
    (model_dir / "config.json").write_text(json.dumps(config))
    try:
        export_model(ExportSpec(source=str(model_dir), task="text-embedding", name="refused"), work / "out")
    except OrtpackError as exc:
        return {"builds": False, "refused": str(exc), "error_type": type(exc).__name__}
    return {"builds": True, "refused": None}


def _fmt_gate(v: dict[str, Any], precision: str) -> str:
    if "error" in v:
        return "error"
    g = v["gate"]
    verdict = "pass" if v["passed"] else "**miss**"
    if precision == "fp32":
        return f"{verdict} {g['max_abs_diff']:.1e} / {g['min_cosine']:.6f}"
    return f"{verdict} {g['min_cosine']:.3f} / {g['mean_cosine']:.3f} / {g['neighbour_agreement']:.3f}"


def _fmt_latency(v: dict[str, Any]) -> str:
    if "p50_ms" not in v:
        return "-"
    loaded = " LOADED" if v.get("load_contaminated") else ""  # over one other runnable task per core
    return f"{v['p50_ms']:.2f} ({v['speedup_vs_torch']:.1f}x){loaded}"


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    from ortpack.components.core.report.tables import format_fusions

    lines = [
        "| model_type | builds | exporter | nodes raw → fp32 | fuser | fusions (fp32) | fp32 gate: max diff / min cos "
        "| int8 gate: min cos / mean cos / neighbours | b1×16 torch ms | fp32 ms (vs torch) | int8 ms (vs torch) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        if "refused" in row:
            lines.append(f"| {name} | refused (exit 2): {row['refused'].split(';')[0]} | | | | | | | | | |")
            continue
        if "variants" not in row:
            lines.append(f"| {name} | **no**: {row.get('error', '')[:120]} | | | | | | | | | |")
            continue
        fp32 = row["variants"].get("fp32", {"error": ""})
        int8 = row["variants"].get("int8", {"error": ""})
        fusions = format_fusions(fp32.get("fusions", {})) or "none"
        nodes = f"{row['nodes_raw']} → {fp32.get('nodes_after', '?')}"
        builds = "yes" if row["builds"] else "**no**"
        lines.append(
            f"| {name} | {builds} | {row['exporter']} | {nodes} | {fp32.get('fuser', '-')} "
            f"| {fusions} | {_fmt_gate(fp32, 'fp32')} | {_fmt_gate(int8, 'int8')} | {row['torch_p50_ms']:.2f}"
            f"{' LOADED' if row.get('torch_load', {}).get('load_contaminated') else ''} "
            f"| {_fmt_latency(fp32)} | {_fmt_latency(int8)} |"
        )
    return "\n".join(lines) + "\n"


def survey_markdown(rows: dict[str, dict[str, Any]]) -> str:
    """One row per family and pair: what fused, the gates, fp32 and int8 p50 at both shapes, and
    whether families.py now uses the pair (the survey is how it was chosen)."""
    from ortpack.components.core.exporters.families import FAMILIES
    from ortpack.components.core.report.tables import format_fusions

    lines = [
        "| family: exporter + fuser | used now | nodes raw → fp32 | fusions (fp32) | fp32 / int8 gate "
        "| torch b1×16 / b16×128 ms | fp32 b1×16 / b16×128 ms | int8 b1×16 / b16×128 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def by_batch(shapes: dict[str, float]) -> str:  # b1_s16 before b16_s128
        return " / ".join(f"{shapes[k]:.2f}" for k in sorted(shapes, key=lambda k: int(k.split("_")[0][1:])))

    def p50(v: dict[str, Any]) -> str:
        return by_batch(v["p50_ms_by_shape"]) if v.get("p50_ms_by_shape") else "-"

    for name, row in rows.items():
        if "variants" not in row:
            lines.append(f"| {name} | | **export failed**: {row.get('error', '')[:100]} | | | | | |")
            continue
        fp32 = row["variants"].get("fp32", {"error": ""})
        int8 = row["variants"].get("int8", {"error": ""})
        fusions = format_fusions(fp32.get("fusions", {})) or "none"
        gates = " / ".join("error" if "error" in v else "pass" if v["passed"] else "miss" for v in (fp32, int8))
        torch_ms = by_batch(row["torch_p50_ms_by_shape"])
        model_type, pair = name.split(" ", 1)
        family = FAMILIES[model_type]
        chosen = "**yes**" if pair == f"{family.exporter} + {family.fuser}" else ""
        nodes = f"{row['nodes_raw']} → {fp32.get('nodes_after', '?')}"
        lines.append(f"| {name} | {chosen} | {nodes} | {fusions} | {gates} | {torch_ms} | {p50(fp32)} | {p50(int8)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from ortpack.components.core.exporters.families import supported_model_types

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default=",".join(supported_model_types()), help="model_types to build")
    parser.add_argument("--no-minilm", action="store_true", help="skip the real all-MiniLM-L6-v2 row")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per benchmark shape")
    parser.add_argument("--out", default="", help="output path stem (default bench/results/coverage or family_survey)")
    parser.add_argument("--survey", action="store_true", help="every exporter + fuser pair at MiniLM's size")
    args = parser.parse_args()
    if args.survey and "--families" not in sys.argv:
        from ortpack.components.core.exporters.families import FAMILIES

        args.families = ",".join(n for n, f in sorted(FAMILIES.items()) if (f.exporter, f.fuser) != SURVEY_PAIRS[0])
    args.out = args.out or str(ROOT / "bench" / "results" / ("family_survey" if args.survey else "coverage"))
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("ortpack.export", "ortpack.optimize", "ortpack.parity", "ortpack.benchmark", "onnxruntime"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    from tests.models import make_tiny_encoder, minilm_dir

    rows: dict[str, dict[str, Any]] = {}
    work_root = Path(tempfile.mkdtemp(prefix="ortpack-coverage-"))
    try:
        if args.survey:
            rows = survey([f for f in args.families.split(",") if f], work_root, args.budget)
        for model_type in [f for f in args.families.split(",") if f and not args.survey]:
            log.info("%s: building", model_type)
            work = work_root / model_type
            checkpoint = make_tiny_encoder(model_type, work / "checkpoint")
            rows[model_type] = build_family(checkpoint, f"tiny-{model_type.replace('_', '-')}", work, args.budget)
            log.info("%s: %s", model_type, "builds" if rows[model_type]["builds"] else rows[model_type])
        if not args.no_minilm and not args.survey:
            log.info("all-MiniLM-L6-v2: building")
            rows["all-MiniLM-L6-v2 (real)"] = build_family(
                minilm_dir(), "all-MiniLM-L6-v2", work_root / "minilm", args.budget
            )
        for model_type in REFUSED if not args.survey else ():
            rows[model_type] = refusal(model_type, work_root / "refused")
    finally:
        shutil.rmtree(work_root, ignore_errors=True)

    import onnxruntime
    import torch
    import transformers

    from ortpack.kernel.hardware import this_machine

    hardware = this_machine()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": hardware.summary(), "cores": hardware.cores},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "shape": SHAPE,
    }
    out.with_suffix(".json").write_text(json.dumps({**meta, "families": rows}, indent=2) + "\n")
    table = survey_markdown(rows) if args.survey else markdown(rows)
    out.with_suffix(".md").write_text(
        f"Generated by `python bench/coverage.py{' --survey' if args.survey else ''}` on {meta['created_at']} "
        f"({meta['machine']['cpu']}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"onnxruntime {onnxruntime.__version__}).\n\n{table}"
    )
    print(table)
    failed = [name for name, row in rows.items() if "refused" not in row and not row["builds"]]
    wrongly_built = [name for name, row in rows.items() if "refused" in row and row["builds"]]
    return 1 if failed or wrongly_built else 0


if __name__ == "__main__":
    sys.exit(main())
