"""The plain-text table the CLI prints and the Markdown summary for KFP: one row per variant, the
banners, the machines the checks ran on."""

from __future__ import annotations

from collections.abc import Sequence

from ortpack.components.core.artifacts import ExportResult, ParityReport, VariantRecord
from ortpack.components.core.report.choice import hardware_of, p50, verdict
from ortpack.components.core.report.numbers import (
    Row,
    engine_loads,
    format_metric,
    format_ms,
    format_ratio,
    gated_metrics,
    load_cell,
    load_line,
    measured_under,
)
from ortpack.components.core.tasks import get_family

# ---------------------------------------------------------------------------- tables


def summary_rows(export: ExportResult, records: Sequence[VariantRecord]) -> list[Row]:
    """Header plus one row per engine: PyTorch first, then each variant."""
    shapes = list(export.torch_latency)
    columns = get_family(export.task).report.columns
    loads = engine_loads(export, records)
    header: Row = (
        "variant",
        "gate",
        *(c[0] for c in columns),
        "MB",
        *(f"p50 {s}" for s in shapes),
        *(f"vs torch {s}" for s in shapes),
        "load",
    )
    rows = [header]
    rows.append(
        (
            "pytorch",
            "-",
            *("-" for _ in columns),
            f"{export.metrics['mb']:.1f}",
            *(format_ms(export.torch_latency[s]["p50_ms"]) for s in shapes),
            *(format_ratio(1.0) for _ in shapes),
            load_cell(loads["pytorch"]),
        )
    )
    for rec in records:
        v, bench, limits = rec.parity.values, rec.benchmark, _limits(rec.parity)
        rows.append(
            (
                rec.variant_id,
                "pass" if rec.passed else "MISS",
                *(format_metric(m, v[m], limits.get(m)) if m in v else "-" for _, m, _ in columns),
                f"{rec.built.metrics['mb']:.1f}",
                *(p50(rec, s) for s in shapes),
                *(
                    format_ratio(bench.speedup_vs_torch[s]) if bench and s in bench.speedup_vs_torch else "-"
                    for s in shapes
                ),
                load_cell(loads.get(rec.variant_id)),
            )
        )
    return rows


def _limits(parity: ParityReport) -> dict[str, float]:
    return {m.name: m.limit for m in gated_metrics(parity)}


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


def hardware_rows(records: Sequence[VariantRecord]) -> list[Row]:
    """Per variant: where the gate, the probe and the benchmark ran."""
    rows: list[Row] = [("variant", "checked on", "CPU", "int8 kernels", "cores", "probe", "benchmark providers")]
    for rec in records:
        hw = rec.parity.hardware or {}
        rows.append(
            (
                rec.variant_id,
                rec.parity.validated_on,
                str(hw.get("cpu_model", "-")),
                str(hw.get("int8_kernel", "-")),
                str(hw.get("cores", "-")),
                probe_cell(rec.parity),
                ", ".join(rec.benchmark.execution_providers) if rec.benchmark else "-",
            )
        )
    return rows


def probe_cell(parity: ParityReport) -> str:
    """`pass (48)`, `MISS (48)` or `-`: the probe check on the build machine."""
    probe = parity.probe
    return "-" if not probe else ("pass" if probe["passed"] else "MISS") + f" ({probe['samples']})"


def proven_on(parity: ParityReport) -> str:
    """`AMD EPYC (x86_64, avx2 int8 kernels, 2 cores), CPUExecutionProvider`: where the gate ran."""
    hw = parity.hardware
    machine = hardware_of(hw).summary() if hw else "an unrecorded machine"
    return f"{machine}, {parity.validated_on}"


def format_summary(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    """The table the CLI prints after a build, every miss spelled out below it, then the verdict
    and the load the timings ran under."""
    text = format_table(summary_rows(export, records))
    misses = [f"missed: {r.parity.summary()}" for r in records if not r.passed]
    under = [measured_under(export, records), load_line(export, records)]
    return "\n".join([text, *misses, *verdict(records), *under, *banners(export, records)])


def markdown_summary(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    rows = summary_rows(export, records)
    lines = [f"# {export.name}: {sum(r.passed for r in records)} of {len(records)} variants passed", ""]
    lines.append("| " + " | ".join(rows[0]) + " |")
    lines.append("|" + "|".join("---" for _ in rows[0]) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    misses = [r.parity.summary() for r in records if not r.passed]
    if misses:
        lines += ["", "**Dropped (missed the parity gate):**", ""] + [f"- {m}" for m in misses]
    lines += ["", *(f"- {line.strip()}" for line in verdict(records)), "", measured_under(export, records)]
    lines += ["", load_line(export, records)]
    return "\n".join(lines) + "\n"
