"""report.html: one self-contained page (inline PNG plots, no network) with the verdict first, the
parity tables, the int8 search, the build and the baseline comparison."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortpack.components.core.artifacts import ExportResult, VariantRecord
from ortpack.components.core.quantization.int8_search import table
from ortpack.components.core.report.choice import ServingChoice, choice_here, choices_elsewhere, p50
from ortpack.components.core.report.numbers import (
    accuracy_cost,
    format_metric,
    format_ratio,
    gated_metrics,
    load_line,
    load_verdict,
    measured_under,
    shape_label,
)
from ortpack.components.core.report.plots import plot_agreement, plot_distance, plot_latency, plot_sizes
from ortpack.components.core.report.tables import (
    banners,
    format_fusions,
    hardware_rows,
    markdown_summary,
    proven_on,
    summary_rows,
)
from ortpack.components.core.tasks import get_family

if TYPE_CHECKING:
    from ortpack.components.core.compat import BaselineCheck


# ---------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:1.2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4}.pass{color:#176e2c;font-weight:600}.miss{color:#b00020;font-weight:600}
img{max-width:100%}code{background:#f4f4f4;padding:0 3px}.sub{color:#555;margin:0 0 .6em}
.verdict{border:2px solid #176e2c;border-radius:6px;background:#f4faf5;padding:.5em 1.2em .7em;margin:.8em 0}
.verdict.none{border-color:#b00020;background:#fdf3f4}
.verdict .choice{font-size:1.3em;margin:.2em 0 .5em}
.verdict .variant{font:600 1em ui-monospace,monospace;background:#176e2c;color:#fff;padding:1px 7px;border-radius:4px}
.verdict dl{display:grid;grid-template-columns:8.5em 1fr;gap:.2em .8em;margin:.3em 0 .6em}
.verdict dt{font-weight:600;color:#444}.verdict dd{margin:0}
.verdict table{background:#fff;width:100%}.verdict h3{font-size:1em;margin:.6em 0 .1em}
.warn{color:#b00020;font-weight:600}.quiet{color:#555}
tr.gated td{background:#fff8dc}tr.gated td.mark{font-weight:700;color:#7a5b00}
details{margin:.4em 0}summary{cursor:pointer;color:#444}td:first-child{white-space:nowrap}
.verdict td{vertical-align:top}.cost,.verdict td:nth-child(3),.verdict td:nth-child(4){white-space:nowrap}
"""


class Html(str):
    """Text that is already HTML (the table helper does not escape it)."""


def _cell(value: Any) -> str:
    text = value if isinstance(value, Html) else html.escape(str(value))
    cls = "pass" if text == "pass" else "miss" if text == "MISS" else "mark" if text == "gated" else ""
    return f"<td class='{cls}'>{text}</td>" if cls else f"<td>{text}</td>"


def _table(rows: Sequence[Sequence[Any]], *, row_class: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in rows[0])
    tr = f"<tr class='{row_class}'>" if row_class else "<tr>"
    body = "".join(tr + "".join(_cell(c) for c in row) + "</tr>" for row in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def _cost_html(rec: VariantRecord) -> Html:
    """The gated metrics, one a line, a missed one in red."""
    lines = [
        html.escape(m.describe()) if m.passed else f"<span class='miss'>{html.escape(m.describe())}</span>"
        for m in gated_metrics(rec.parity)
    ]
    return Html(f"<span class='cost'>{'<br>'.join(lines) or 'no gated metric'}</span>")


def _alternatives_table(choice: ServingChoice) -> str:
    shape = next(iter(choice.chosen.benchmark.shapes), "") if choice.chosen and choice.chosen.benchmark else ""
    rows: list[list[Any]] = [
        ["variant", "why not", f"p50 {shape}".strip(), "vs PyTorch", "accuracy (the gate's metrics)", "gate ran on"]
    ]
    for alt in choice.alternatives:
        bench = alt.record.benchmark
        ratio = bench.speedup_vs_torch.get(shape) if bench else None
        rows.append(
            [
                alt.record.variant_id,
                alt.reason,
                p50(alt.record, shape),
                format_ratio(ratio) if ratio else "-",
                _cost_html(alt.record),
                proven_on(alt.record.parity),
            ]
        )
    return _table(rows)


def verdict_box(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    """The first screen: which variant a server here serves, why, at what accuracy cost, where it
    was proven, whether the timings are trustworthy, and why not each alternative."""
    here = choice_here(records)
    load_text, loaded = load_verdict(export, records)
    timing = f"<dd class='{'warn' if loaded else 'quiet'}'>{html.escape(load_text)}</dd>"
    if here.chosen is None:
        return (
            "<section class='verdict none'><p class='choice'>No variant passed its gate: <b>nothing ships</b>.</p>"
            f"<dl><dt>Timings</dt>{timing}</dl><h3>Variants</h3>{_alternatives_table(here)}</section>"
        )
    chosen = here.chosen
    probe = chosen.parity.probe
    probe_text = (
        f"; its probe set ({probe['samples']} {get_family(export.task).report.unit}) "
        f"{'passed' if probe['passed'] else 'MISSED'} there, and every serving node replays it before ready"
        if probe
        else ""
    )
    parts = [
        "<section class='verdict'>",
        f"<p class='choice'>Serves <span class='variant'>{html.escape(chosen.variant_id)}</span> "
        f"<span class='quiet'>— <code>--variant auto</code> on {html.escape(here.where)}</span></p>",
        "<dl>",
        f"<dt>Why</dt><dd>{html.escape(here.why)}</dd>",
        f"<dt>Accuracy cost</dt><dd>{html.escape(accuracy_cost(chosen, ' · '))}"
        " <span class='quiet'>(against PyTorch, the gate's own metrics)</span></dd>",
        f"<dt>Proven on</dt><dd>{html.escape(proven_on(chosen.parity) + probe_text)}</dd>",
        f"<dt>Timings</dt>{timing}",
        "</dl>",
    ]
    if here.alternatives:
        parts += ["<h3>Not chosen</h3>", _alternatives_table(here)]
    elsewhere = [
        f"on {c.where}: {c.chosen.variant_id if c.chosen else 'nothing'} ({c.why})" for c in choices_elsewhere(records)
    ]
    if elsewhere:
        parts.append(f"<p class='quiet'>Elsewhere: {html.escape('; '.join(elsewhere))}.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def parity_tables(records: Sequence[VariantRecord]) -> str:
    """The numbers each gate checks (highlighted, with threshold, margin and result), then every
    diagnostic number collapsed below."""
    gated: list[list[Any]] = [["gate", "variant", "metric", "value", "threshold", "margin", "result"]]
    diagnostic: list[list[Any]] = [["variant", "metric", "value"]]
    for rec in records:
        checked = gated_metrics(rec.parity)
        for m in checked:
            shown = format_metric(m.name, m.value, m.limit)
            result = "pass" if m.passed else "MISS"
            gated.append(["gated", rec.variant_id, m.name, shown, m.threshold, f"{m.margin:+.2g}", result])
        names = {m.name for m in checked}
        for name, value in sorted(rec.parity.values.items()):
            if name not in names:
                diagnostic.append([rec.variant_id, name, format_metric(name, value)])
    return (
        _table(gated, row_class="gated")
        + f"<details><summary>Diagnostic numbers, not gated ({len(diagnostic) - 1}): per batch size, "
        "per decode mode, the rest</summary>" + _table(diagnostic) + "</details>"
    )


def int8_search_sections(records: Sequence[VariantRecord]) -> list[str]:
    """Per int8 or int4 variant whose recipe was chosen among several, the table of every candidate
    (components/core/quantization/int8_search.py): what each measured, its size and speed, which
    shipped; for static int8 (images) also what it is made of (`_static_int8_facts`), for
    weight-only int4 the layers kept in float with the KL each added alone."""

    parts = []
    for rec in records:
        for precision in ("int8", "int4"):
            record = rec.built.metrics.get(precision) or {}
            rows = table(record)
            facts = _static_int8_facts(rec, records) if precision == "int8" else _float_layers(record)
            if len(rows) < 2 and not facts:
                continue
            # the image tasks take the first recipe within the int8 gate, the recipes ordered fastest first
            rule = str(record.get("rule") or "the first within the int8 gate, the recipes ordered fastest first")
            variant = html.escape(rec.variant_id)
            how = (
                f"<p>Candidates, each judged by the task's int8 gate on the validation images; the one shipped is "
                f"{html.escape(rule)}. The validate step then gates it again.</p>"
                if precision == "int8" and facts
                else f"<p>Every candidate was built and measured; the winner is {html.escape(rule)}. Latency: each "
                "candidate's fastest call in ms, one thread, the candidates interleaved. The validate step then "
                "gates the winner on the whole validation set.</p>"
            )
            parts += [
                f"<h2 id='{precision}-search-{variant}'>{precision} recipe search: {variant}</h2>",
                *facts,
                *([how, _table(rows)] if len(rows) > 1 else []),
            ]
    return parts


def _float_layers(record: dict[str, Any]) -> list[str]:
    """The layer groups a weight-only search returned to float, with the KL each added quantized alone."""
    kept = record.get("float_layers") or {}
    if not kept:
        return []
    listed = ", ".join(f"{html.escape(name)} (KL {cost:.3g})" for name, cost in kept.items())
    return [f"<p>No recipe passed the gate with every layer quantized; kept in float, costliest first: {listed}.</p>"]


def _static_int8_facts(rec: VariantRecord, records: Sequence[VariantRecord]) -> list[str]:
    """What a static int8 variant is made of (components/core/quantization/static_int8.py): weight width,
    calibration, bias correction, the kernels ONNX Runtime runs, the layers kept in float with
    their measured sensitivity, and its speed-up over the fp32 variant at each benchmark shape."""
    record = rec.built.metrics.get("int8") or {}
    if not record.get("weight_bits"):
        return []
    bits = int(record["weight_bits"])
    width = (
        "8-bit weights (exact where the CPU sums u8 x s8 without saturation: VNNI, AMX; a server on an "
        "AVX2-only CPU serves another variant)"
        if bits >= 8
        else "7-bit weights (exact on every x86-64 CPU)"
    )
    kernels = record.get("kernels") or {}
    int8_ops = ", ".join(f"{n} {op}" for op, n in (kernels.get("int8") or {}).items()) or "none"
    float_ops = ", ".join(f"{n} {op}" for op, n in (kernels.get("float") or {}).items()) or "none"
    dequantized = kernels.get("dequantized_float") or []
    lines = [
        f"{width}; activations uint8, {html.escape(str(record.get('calibration') or 'min/max'))}; "
        f"biases {'corrected' if record.get('bias_correction') else 'not corrected'}.",
        f"In the session ONNX Runtime builds: int8 kernels {html.escape(int8_ops)}; float compute "
        f"{html.escape(float_ops)}; float compute fed by dequantized weights: {len(dequantized)}.",
    ]
    fp32 = next((r for r in records if r.built.target == rec.built.target and r.built.precision == "fp32"), None)
    if fp32 is not None and fp32.benchmark and rec.benchmark:
        speedups = [
            f"{fp32_ms / rec_ms:.2f}× at {shape_label(shape)}"
            for shape in rec.benchmark.shapes
            if shape in fp32.benchmark.shapes
            and (rec_ms := rec.benchmark.shapes[shape]["p50_ms"])
            and (fp32_ms := fp32.benchmark.shapes[shape]["p50_ms"])
        ]
        if speedups:
            lines.append("Speed-up over the fp32 variant (p50): " + ", ".join(speedups) + ".")
    floats = record.get("float_layers") or {}
    if floats:
        kept = ", ".join(f"{html.escape(name)} ({value:.3g})" for name, value in floats.items())
        lines.append(
            f"Kept in float ({len(floats)}, the most sensitive first; what each cost the graph's outputs, "
            f"their noise-to-signal against fp32 less the same with that layer in float): {kept}."
        )
    else:
        lines.append("Every quantizable layer runs in int8.")
    return [f"<p>{line}</p>" for line in lines]


def _built_rows(records: Sequence[VariantRecord]) -> list[list[Any]]:
    rows: list[list[Any]] = [
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
        rows.append(
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
    return rows


def _img(alt: str, png: str) -> str:
    return f"<img alt='{alt}' src='data:image/png;base64,{png}'>"


def compatibility_section(check: BaselineCheck) -> str:
    """The "Compatibility with the baseline" section: the verdict against the bundle this build is
    to replace (the pipeline's `baseline_bundle`), what it meant for this build, and `ortpack
    bundle diff`'s table. A box of its own, red when the new bundle cannot search the baseline's
    index."""
    diff = check.diff
    if check.blocks:
        outcome = "Nothing ships: the pipeline required a drop-in (require_compatible)."
    elif check.drop_in:
        outcome = "Vectors of this bundle can search an index built with the baseline."
    else:
        outcome = "Shipped: compatibility was recorded, not required. Re-index before serving this bundle."
    old = f"{diff.old['name']} {diff.old['version']}"
    worst = diff.worst_pair()
    return "\n".join(
        [
            "<h2 id='compatibility'>Compatibility with the baseline</h2>",
            f"<section class='verdict{'' if check.drop_in else ' none'}'>",
            f"<p class='choice'><span class='{'pass' if check.drop_in else 'miss'}'>{html.escape(diff.verdict)}</span>"
            f" against <code>{html.escape(check.baseline)}</code> <span class='quiet'>({html.escape(old)})</span></p>",
            f"<p>{html.escape(f'{worst.old} -> {worst.new}: {worst.reason}')}. {html.escape(outcome)}</p>",
            f"<pre>{html.escape(diff.table())}</pre>",
            "<p class='quiet'>Cross-space retrieval: new-bundle queries searching an index of baseline documents, "
            f"against the baseline's own top-{diff.k} per query; the ratio is the verdict's number (budget "
            f"{diff.budget:g}). See <code>ortpack bundle diff</code>.</p>",
            "</section>",
        ]
    )


def render_html(
    export: ExportResult,
    records: Sequence[VariantRecord],
    versions: dict[str, str],
    compatibility: BaselineCheck | None = None,
) -> str:
    spec = get_family(export.task).report
    passed = sum(r.passed for r in records)
    misses = [r.parity.summary() for r in records if not r.passed]
    loaded = load_verdict(export, records)[1]
    blocked = [compatibility.summary()] if compatibility is not None and compatibility.blocks else []
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>ortpack report: {html.escape(export.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(export.name)}: {passed} of {len(records)} variants passed their parity gate</h1>",
        f"<p class='sub'>Task <code>{html.escape(export.task)}</code>, "
        f"source <code>{html.escape(str(export.source.get('id')))}</code>, "
        f"{int(export.metrics.get('validation_samples', 0))} validation {html.escape(spec.unit)}.</p>",
        *(f"<p class='miss'>{html.escape(b)}</p>" for b in banners(export, records)),
        *(f"<p class='miss'>{html.escape(line)}.</p>" for line in blocked),
        verdict_box(export, records),
        compatibility_section(compatibility) if compatibility else "",
        "<h2>Summary</h2>",
        _table(summary_rows(export, records)),
        f"<p>{html.escape(measured_under(export, records))}</p>",
        f"<p class='{'warn' if loaded else 'quiet'}'>{html.escape(load_line(export, records))}</p>",
    ]
    if spec.speed is not None:
        parts += ["<h2>Speed</h2>", _table(spec.speed(export, records))]
    if misses:
        parts.append(
            "<p class='miss'>Dropped:</p><ul>" + "".join(f"<li>{html.escape(m)}</li>" for m in misses) + "</ul>"
        )
    parts += [
        "<h2>Latency against PyTorch</h2>",
        _img("latency per variant", plot_latency(export, records)),
        "<h2>Agreement with PyTorch, per item</h2>",
        _img("distance to PyTorch per item", plot_distance(spec, records)),
        f"<h2>Agreement of the {spec.agreement[1]} nearest ({spec.unit})</h2>",
        _img("agreement", plot_agreement(spec, records)),
        "<h2>Model size</h2>",
        _img("model size", plot_sizes(export, records)),
        "<h2>Parity numbers and gates</h2>",
        "<p>Highlighted: the numbers each variant's gate checks (a miss drops the variant). "
        "The rest are diagnostics.</p>",
        parity_tables(records),
        "<h2>What each variant was built for</h2>",
        _table(_built_rows(records)),
        *int8_search_sections(records),
        "<h2>Where it was proven</h2>",
        "<p>Each check ran on the machine below. A serving node replays the probe set through the variant "
        "it is about to serve and applies the same gate before it turns ready; int8 numbers depend on the "
        "CPU's int8 kernels.</p>",
        _table(hardware_rows(records)),
        "<h2>Versions</h2>",
        _table([["package", "version"], *sorted(versions.items())]),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_report(
    export_dir: Path,
    records: Sequence[VariantRecord],
    html_path: Path,
    markdown_path: Path | None = None,
    *,
    compatibility: BaselineCheck | None = None,
) -> None:
    """Write report.html (and the Markdown summary) for a build's step records, with the
    comparison with a baseline bundle when there was one."""
    import matplotlib

    matplotlib.use("Agg")
    import onnxruntime

    export = ExportResult.load(export_dir)
    versions = {**export.versions, "onnxruntime": onnxruntime.__version__}
    Path(html_path).write_text(render_html(export, records, versions, compatibility), encoding="utf-8")
    if markdown_path is not None:
        summary = markdown_summary(export, records)
        if compatibility is not None:
            summary += f"\n**Compatibility with the baseline:** {compatibility.summary()}\n"
        Path(markdown_path).write_text(summary, encoding="utf-8")
