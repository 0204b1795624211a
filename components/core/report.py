"""The human report of a build: a self-contained `report.html` (inline PNG plots, no network),
a Markdown summary for KFP, and the plain-text table the CLI prints. All three read the same
step records, so they always agree."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.core.artifacts import ExportResult, VariantRecord
from components.core.tasks import ReportSpec, get_family
from serving.gates import GATES, margins

Row = tuple[str, ...]
_COLOURS = {"pytorch": "#7f7f7f", "fp32": "#1f77b4", "fp16": "#2ca02c", "int8": "#d62728"}


def summary_rows(export: ExportResult, records: Sequence[VariantRecord]) -> list[Row]:
    """Header plus one row per engine: PyTorch first, then each variant."""
    shapes = list(export.torch_latency)
    columns = get_family(export.task).report.columns
    header: Row = (
        "variant",
        "gate",
        *(c[0] for c in columns),
        "MB",
        *(f"p50 {s}" for s in shapes),
        *(f"vs torch {s}" for s in shapes),
    )
    rows = [header]
    torch_cells = tuple(f"{export.torch_latency[s]['p50_ms']:.2f} ms" for s in shapes)
    rows.append(
        (
            "pytorch",
            "-",
            *("-" for _ in columns),
            f"{export.metrics['mb']:.1f}",
            *torch_cells,
            *("1.0x" for _ in shapes),
        )
    )
    for rec in records:
        v, bench = rec.parity.values, rec.benchmark
        rows.append(
            (
                rec.variant_id,
                "pass" if rec.passed else "MISS",
                *(format(v[metric], fmt) if metric in v else "-" for _, metric, fmt in columns),
                f"{rec.built.metrics['mb']:.1f}",
                *(f"{bench.shapes[s]['p50_ms']:.2f} ms" if bench and s in bench.shapes else "-" for s in shapes),
                *(
                    f"{bench.speedup_vs_torch[s]:.1f}x" if bench and s in bench.speedup_vs_torch else "-"
                    for s in shapes
                ),
            )
        )
    return rows


def format_fusions(fusions: dict[str, int]) -> str:
    """`Attention 6, SkipLayerNormalization 12`: fused operator counts, by name; '' when none."""
    return ", ".join(f"{op} {n}" for op, n in sorted(fusions.items()))


def format_table(rows: list[Row]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def banners(export: ExportResult, records: Sequence[VariantRecord]) -> list[str]:
    """Warnings that change what the numbers mean: a degenerate reference, off-target checks."""
    out = []
    if export.degenerate_reference:
        spread = export.metrics.get("reference_spread", 0.0)
        out.append(
            f"WARNING: the PyTorch reference is degenerate (output spread {spread:.3g}): every parity check "
            "passes vacuously; built with --allow-degenerate-reference."
        )
    for rec in records:
        if rec.parity.off_target:
            out.append(
                f"WARNING: {rec.variant_id} was validated on {rec.parity.validated_on}, not on its target's "
                f"{rec.built.execution_providers[0]} (--allow-off-target-validation): it is not proven on its hardware."
            )
    return out


def verdict(records: Sequence[VariantRecord]) -> list[str]:
    """Which variant `--variant auto` will serve, on which hardware, and why (the server's own
    ranking, serving.service.rank_variants, applied to this build's variants)."""
    from components.core.package import variant_record
    from serving.bundle import Variant
    from serving.hardware import HardwareInfo
    from serving.service import rank_variants

    passed = [r for r in records if r.passed]
    if not passed:
        return ["No variant passed its gate: nothing ships."]
    variants = [Variant.model_validate(variant_record(r.built, r.parity, r.benchmark)) for r in passed]
    lines = []
    built_on = next((r.parity.hardware for r in passed if r.parity.hardware), None)
    cases: list[tuple[str, list[str], HardwareInfo | None]] = []
    if built_on:
        here = HardwareInfo(
            **{k: v for k, v in built_on.items() if k != "int8_kernel"} | {"features": tuple(built_on["features"])}
        )
        cases.append((f"On a CPU like this build's ({here.summary()})", ["CPUExecutionProvider"], here))
        baseline = HardwareInfo(machine=here.machine, cpu_model="", features=("avx2", "fma", "f16c"), cores=here.cores)
        if not baseline.has_features(here.features):
            cases.append(
                (
                    "On a CPU with fewer ISA features (e.g. AVX2 only): this build's benchmark is not evidence there;",
                    ["CPUExecutionProvider"],
                    baseline,
                )
            )
    if any(v.target == "cuda" for v in variants):
        cases.insert(
            0, ("On a GPU node (CUDA provider available)", ["CUDAExecutionProvider", "CPUExecutionProvider"], None)
        )
    for where, providers, hardware in cases:
        order = rank_variants(
            variants, providers, hardware or HardwareInfo(machine="", cpu_model="", features=(), cores=1)
        )
        if not order:
            continue
        first, rest = order[0], order[1:]
        shapes = first.benchmark.shapes
        speed = next(iter(shapes), None)
        measured = all(
            v.benchmark.hardware and hardware and hardware.has_features(v.benchmark.hardware.features) for v in order
        )
        if measured and speed:
            timings = ", ".join(
                f"{v.id} {v.benchmark.shapes[speed]['p50_ms']:.2f} ms" for v in order if speed in v.benchmark.shapes
            )
            why = f"the fastest by the benchmark ({timings} at {speed})"
        else:
            why = "the preference order (int8, then fp32; fp16 first on GPUs)"
        fallback = f"; if it misses its probe check on the node, {' then '.join(v.id for v in rest)}" if rest else ""
        lines.append(f"{where} --variant auto serves {first.id}: {why}{fallback}.")
    return lines


def hardware_rows(records: Sequence[VariantRecord]) -> list[Row]:
    """Per variant: where the gate, the probe and the benchmark ran."""
    rows: list[Row] = [("variant", "checked on", "CPU", "int8 kernels", "cores", "probe", "benchmark providers")]
    for rec in records:
        hw = rec.parity.hardware or {}
        probe = rec.parity.probe
        probe_cell = "-" if not probe else ("pass" if probe["passed"] else "MISS") + f" ({probe['samples']})"
        rows.append(
            (
                rec.variant_id,
                rec.parity.validated_on,
                str(hw.get("cpu_model", "-")),
                str(hw.get("int8_kernel", "-")),
                str(hw.get("cores", "-")),
                probe_cell,
                ", ".join(rec.benchmark.execution_providers) if rec.benchmark else "-",
            )
        )
    return rows


def measured_under(records: Sequence[VariantRecord]) -> str:
    """The CPU and load the latencies were measured under (a shared machine drifts)."""
    bench = next((r.benchmark for r in records if r.benchmark and r.benchmark.hardware), None)
    if bench is None:
        return "No variant was benchmarked."
    hw = bench.hardware
    load = f", load average {bench.load_average:.2f} over the last minute" if bench.load_average is not None else ""
    threads = "one ONNX Runtime thread per core" if not bench.threads else f"{bench.threads} ONNX Runtime threads"
    return (
        f"Latency measured on {hw['cpu_model']} ({hw['int8_kernel']} int8 kernels, {hw['cores']} cores, "
        f"{threads}{load}); compare ratios within one build, not across machines."
    )


def format_summary(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    """The table the CLI prints after a build, every miss spelled out below it, then the verdict."""
    text = format_table(summary_rows(export, records))
    misses = [f"missed: {r.parity.summary()}" for r in records if not r.passed]
    return "\n".join([text, *misses, *verdict(records), measured_under(records), *banners(export, records)])


def markdown_summary(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    rows = summary_rows(export, records)
    lines = [f"# {export.name}: {sum(r.passed for r in records)} of {len(records)} variants passed", ""]
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "|".join("---" for _ in rows[0]) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    misses = [r.parity.summary() for r in records if not r.passed]
    if misses:
        lines += ["", "**Dropped (missed the parity gate):**", ""] + [f"- {m}" for m in misses]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- plots


def _figure_png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _colour(name: str) -> str:
    return next((c for key, c in _COLOURS.items() if name.endswith(key) or name == key), "#9467bd")


def plot_latency(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    import matplotlib.pyplot as plt

    shapes = list(export.torch_latency)
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.2 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        names, p50, p95 = ["pytorch"], [export.torch_latency[shape]["p50_ms"]], [export.torch_latency[shape]["p95_ms"]]
        for rec in records:
            if rec.benchmark and shape in rec.benchmark.shapes:
                names.append(rec.variant_id)
                p50.append(rec.benchmark.shapes[shape]["p50_ms"])
                p95.append(rec.benchmark.shapes[shape]["p95_ms"])
        ypos = range(len(names))
        ax.barh(ypos, p50, color=[_colour(n) for n in names], label="p50")
        ax.scatter(p95, ypos, marker="|", s=300, color="black", label="p95", zorder=3)
        for y, (a, b) in enumerate(zip(p50, p95, strict=True)):
            ax.text(b, y, f"  {a:.2f} ms ({p50[0] / a:.1f}x)", va="center", fontsize=8)
        ax.set_yticks(list(ypos), names)
        ax.invert_yaxis()
        ax.set_xlim(0, max(p95) * 1.6)
        ax.set_xlabel("latency, ms (bar p50, tick p95)")
        ax.set_title(shape.replace("_", " x ").replace("b", "batch ").replace("s", "tokens ", 1))
    axes[0][0].legend(loc="lower right", fontsize=8)
    return _figure_png(fig)


def plot_distance(spec: ReportSpec, records: Sequence[VariantRecord]) -> str:
    """Per item, the distance to PyTorch on a log axis (1 - cosine per sentence: fp32 near 1e-7,
    int8 near 1e-2; the largest probability difference per image), with the variant's own gate.
    Distances of exactly 0 cannot sit on a log axis: they are drawn at the left edge as open
    circles and counted, not clipped into the data."""
    import matplotlib.pyplot as plt
    import numpy as np

    key, label, gate_of = spec.distance
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.55 * max(1, len(records))))
    positive = [d for r in records for d in r.parity.per_item.get(key, []) if d > 0]
    floor = min(positive) / 3 if positive else 1e-9
    exact_zero_drawn = gate_drawn = False
    for y, rec in enumerate(records):
        gap = np.asarray(rec.parity.per_item.get(key, []), dtype=float)
        if gap.size == 0:
            continue
        jitter = np.random.default_rng(y).uniform(-0.18, 0.18, gap.size)
        nonzero = gap > 0
        ax.scatter(gap[nonzero], y + jitter[nonzero], s=5, alpha=0.45, color=_colour(rec.variant_id))
        zeros = int((~nonzero).sum())
        if zeros:
            ax.scatter(
                [floor] * zeros,
                y + jitter[~nonzero],
                s=14,
                facecolors="none",
                edgecolors="black",
                label=None if exact_zero_drawn else "exactly 0 (drawn at the left edge)",
            )
            ax.text(floor, y - 0.32, f"{zeros} exactly 0", fontsize=7)
            exact_zero_drawn = True
        ax.plot([max(float(np.median(gap)), floor)] * 2, [y - 0.3, y + 0.3], color="black", lw=1.5)
        limit = gate_of(rec.parity.thresholds)
        if limit is not None:
            ax.plot(
                [max(limit, floor)] * 2,
                [y - 0.4, y + 0.4],
                color="red",
                lw=1,
                ls="--",
                label=None if gate_drawn else "the variant's gate",
            )
            gate_drawn = True
    ax.set_xscale("log")
    ax.set_yticks(range(len(records)), [r.variant_id for r in records])
    ax.invert_yaxis()
    ax.set_xlabel(f"{label} (black: median)")
    if exact_zero_drawn or gate_drawn:
        ax.legend(loc="lower right", fontsize=8)
    return _figure_png(fig)


def plot_agreement(spec: ReportSpec, records: Sequence[VariantRecord]) -> str:
    """Per variant, the share of items by how many of PyTorch's k neighbours (or top-k classes)
    the variant keeps; darker is more; the mean (the gated number) at the right."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch

    key, k, label = spec.agreement
    fig, ax = plt.subplots(figsize=(8, 1.1 + 0.55 * max(1, len(records))))
    for y, rec in enumerate(records):
        overlap = np.asarray(rec.parity.per_item.get(key, []), dtype=float)
        if overlap.size == 0:
            continue
        left = 0.0
        for share_k in sorted(set(np.round(overlap, 2)), reverse=True):
            share = float(np.mean(np.round(overlap, 2) == share_k))
            ax.barh(y, share, left=left, color=_colour(rec.variant_id), alpha=0.25 + 0.75 * share_k, edgecolor="white")
            if share > 0.06:
                ax.text(left + share / 2, y, f"{share_k * k:.0f}/{k}", ha="center", va="center", fontsize=7)
            left += share
        ax.text(1.01, y, f"mean {overlap.mean():.3f}", va="center", fontsize=8)
    ax.set_xlim(0, 1.15)
    ax.set_yticks(range(len(records)), [r.variant_id for r in records])
    ax.invert_yaxis()
    ax.set_xlabel(label)
    ax.legend(
        handles=[
            Patch(color="#555555", alpha=1.0, label=f"{k}/{k} kept (darkest)"),
            Patch(color="#555555", alpha=0.25, label=f"0/{k} kept (lightest)"),
        ],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35),
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    return _figure_png(fig)


def plot_sizes(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    import matplotlib.pyplot as plt

    names = ["raw export", *(r.variant_id for r in records)]
    sizes = [export.metrics["mb"], *(r.built.metrics["mb"] for r in records)]
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.45 * len(names)))
    ax.barh(range(len(names)), sizes, color=[_colour("pytorch"), *(_colour(r.variant_id) for r in records)])
    for y, mb in enumerate(sizes):
        ax.text(mb, y, f" {mb:.1f} MB", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, max(sizes) * 1.25)
    ax.set_xlabel("model file size, MB")
    return _figure_png(fig)


# ---------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4}.pass{color:#176e2c;font-weight:600}.miss{color:#b00020;font-weight:600}
img{max-width:100%}code{background:#f4f4f4;padding:0 3px}
"""


def _table(rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in rows[0])
    body = ""
    for row in rows[1:]:
        cells = []
        for c in row:
            text = html.escape(str(c))
            cls = ' class="pass"' if text == "pass" else ' class="miss"' if text == "MISS" else ""
            cells.append(f"<td{cls}>{text}</td>")
        body += "<tr>" + "".join(cells) + "</tr>"
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(export: ExportResult, records: Sequence[VariantRecord], versions: dict[str, str]) -> str:
    spec = get_family(export.task).report
    passed = sum(r.passed for r in records)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>ortpack report: {html.escape(export.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(export.name)}: {passed} of {len(records)} variants passed their parity gate</h1>",
        f"<p>Task <code>{html.escape(export.task)}</code>, "
        f"source <code>{html.escape(str(export.source.get('id')))}</code>, "
        f"{int(export.metrics.get('validation_samples', 0))} validation samples.</p>",
        "<h2>Summary</h2>",
        _table(summary_rows(export, records)),
        "<h2>Verdict</h2>",
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in verdict(records)) + "</ul>",
        f"<p>{html.escape(measured_under(records))}</p>",
    ]
    parts = parts[:4] + [f"<p class='miss'>{html.escape(b)}</p>" for b in banners(export, records)] + parts[4:]
    misses = [r.parity.summary() for r in records if not r.passed]
    if misses:
        parts.append(
            "<p class='miss'>Dropped:</p><ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in misses) + "</ul>"
        )
    parts += [
        "<h2>Latency against PyTorch</h2>",
        f"<img alt='latency per variant' src='data:image/png;base64,{plot_latency(export, records)}'>",
        "<h2>Agreement with PyTorch, per item</h2>",
        f"<img alt='distance to PyTorch per item' src='data:image/png;base64,{plot_distance(spec, records)}'>",
        f"<h2>Agreement of the {spec.agreement[1]} nearest ({spec.unit})</h2>",
        f"<img alt='agreement' src='data:image/png;base64,{plot_agreement(spec, records)}'>",
        "<h2>Model size</h2>",
        f"<img alt='model size' src='data:image/png;base64,{plot_sizes(export, records)}'>",
        "<h2>Parity numbers and gates</h2>",
    ]
    gate_rows: list[list[Any]] = [["variant", "metric", "value", "gate", "margin"]]
    for rec in records:
        margin = margins(rec.parity.values, rec.parity.thresholds)
        for name, value in sorted(rec.parity.values.items()):
            op, field = GATES.get(name, ("", ""))
            limit = rec.parity.thresholds.get(field)
            gate_rows.append(
                [
                    rec.variant_id,
                    name,
                    f"{value:.6g}",
                    f"{op} {limit:g}" if limit is not None else "",
                    f"{margin[name]:+.3g}" if name in margin else "",
                ]
            )
    parts.append(_table(gate_rows))
    facts: list[list[Any]] = [
        [
            "variant",
            "execution providers",
            "validated on",
            "ORT",
            "opset",
            "offline level",
            "nodes before -> after",
            "fuser",
            "fusions",
        ]
    ]
    for rec in records:
        b = rec.built
        fusions = format_fusions(b.metrics.get("fusions", {}))
        fuser = str(b.metrics.get("fuser", "none"))
        if not fusions:  # shipped on its gate, but say so: nothing was fused
            fusions = "not fused" if fuser == "none" else f"not fused ({fuser} found no pattern)"
        facts.append(
            [
                b.variant_id,
                ", ".join(b.execution_providers),
                rec.parity.validated_on,
                b.ort_version,
                b.opset,
                b.offline_optimization_level,
                f"{b.metrics['nodes_before']} -> {b.metrics['nodes_after']}",
                fuser,
                fusions,
            ]
        )
    parts += [
        "<h2>What each variant was built for</h2>",
        _table(facts),
        "<h2>Where it was proven</h2>",
        "<p>Each check ran on the machine below. A serving node replays the probe set through the variant "
        "it is about to serve and applies the same gate before it turns ready; int8 numbers depend on the "
        "CPU's int8 kernels.</p>",
        _table(hardware_rows(records)),
        "<h2>Versions</h2>",
        _table([["package", "version"], *sorted(versions.items())]),
    ]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    export_dir: Path, records: Sequence[VariantRecord], html_path: Path, markdown_path: Path | None = None
) -> None:
    """Write report.html (and the Markdown summary) for a build's step records."""
    import matplotlib

    matplotlib.use("Agg")
    import onnxruntime

    export = ExportResult.load(export_dir)
    versions = {**export.versions, "onnxruntime": onnxruntime.__version__}
    Path(html_path).write_text(render_html(export, records, versions), encoding="utf-8")
    if markdown_path is not None:
        Path(markdown_path).write_text(markdown_summary(export, records), encoding="utf-8")
