"""The human report of a build: a self-contained `report.html` (inline PNG plots, no network),
a Markdown summary for KFP, and the plain-text table the CLI prints. All three read the same
step records, so they always agree.

The report opens with the verdict: the variant a server on this build's machine picks (the
server's own ranking, `ortpack.kernel.selection.rank_variants`), the alternatives and why not, the accuracy
cost of each in its gate's own metrics, where the gate ran, and whether the timings were taken
under load (components/core/timing.py)."""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortpack.components.core.artifacts import ExportResult, ParityReport, VariantRecord
from ortpack.components.core.errors import and_list
from ortpack.components.core.tasks import get_family
from ortpack.components.core.tasks.family import ReportSpec
from ortpack.components.core.timing import LoadRecord, load_of, worst_load
from ortpack.kernel.contracts import get_contract
from ortpack.kernel.gates import margins
from ortpack.kernel.hardware import HardwareInfo
from ortpack.kernel.selection import PREFERENCE, TARGET_PROVIDER, measured_p50, rank_variants
from ortpack.kernel.targets import TARGETS

if TYPE_CHECKING:
    from ortpack.components.core.compat import BaselineCheck
    from ortpack.kernel.bundle import Variant

Row = tuple[str, ...]
_COLOURS = {"pytorch": "#7f7f7f", "fp32": "#1f77b4", "fp16": "#2ca02c", "int8": "#d62728"}
CPU_PROVIDER = TARGETS["cpu"].provider
# The x86-64 level every CPU that serves int8 has; a build machine with more may not be evidence there.
BASELINE_FEATURES = ("avx2", "fma", "f16c")

# ---------------------------------------------------------------------------- numbers


def format_ms(ms: float) -> str:
    """Latency with 3 significant digits: `3.35 ms`, `591 ms`, `8.27 s`."""
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def format_ratio(ratio: float) -> str:
    """A speed-up: `4.1×`, `12×`."""
    return f"{ratio:.1f}×" if ratio < 10 else f"{ratio:.0f}×"


def _decimals(limit: float) -> int:
    text = f"{limit:.10f}".rstrip("0")
    return len(text.split(".")[1])


def format_metric(name: str, value: float, limit: float | None = None) -> str:
    """A parity number at the precision its kind needs: cosines 4 decimals, agreements 3, abs
    differences 2 significant digits; never fewer decimals than the gate's `limit` has, and more
    where rounding would make a value look equal to its limit."""
    kind = name.rsplit(".", 1)[-1]
    places = 4 if "cosine" in kind else 3 if "agreement" in kind else None
    if places is None:
        return f"{value:.2g}" if "diff" in kind else f"{value:.4g}"
    if limit is not None:
        places = max(places, _decimals(limit))
        if f"{value:.{places}f}" == f"{limit:.{places}f}" and value != limit:
            places += 3
    return f"{value:.{places}f}"


def metric_label(name: str) -> str:
    """`min_cosine` -> `min cosine`, `b32.neighbour_agreement` -> `b32 neighbour agreement`."""
    return name.replace("_", " ").replace(".", " ")


def shape_label(shape: str) -> str:
    """`b1_s16` -> `batch 1 × 16 tokens`, `b8_480x640` -> `batch 8 × 480x640`."""
    match = re.fullmatch(r"b(\d+)_(?:s(\d+)|(.+))", shape)
    if match is None:
        return shape
    batch, tokens, other = match.groups()
    return f"batch {batch} × {f'{tokens} tokens' if tokens else other}"


# ---------------------------------------------------------------------------- gates


@dataclass(frozen=True, kw_only=True)
class GatedMetric:
    """One number the gate checks: its value, the comparison, the limit and the margin to it
    (`ortpack.kernel.gates.margins`: negative is a miss)."""

    name: str
    value: float
    op: str
    limit: float
    margin: float

    @property
    def passed(self) -> bool:
        return self.margin >= 0  # False for NaN, as the gate says

    @property
    def threshold(self) -> str:
        """`≥ 0.9`."""
        return f"{'≤' if self.op == '<=' else '≥'} {self.limit:g}"

    def describe(self) -> str:
        """`min cosine 0.9492 (gate ≥ 0.9)`."""
        return f"{metric_label(self.name)} {format_metric(self.name, self.value, self.limit)} (gate {self.threshold})"


def gated_metrics(parity: ParityReport) -> list[GatedMetric]:
    """The metrics this variant's gate checks (a threshold is set and the value was measured), in
    the order of its task's gates (kernel/contracts/<task>.py); every other value is a diagnostic."""
    gates = get_contract(parity.task).gates
    by_metric = {g.metric: g for g in gates.values()}
    out = []
    for metric, margin in margins(parity.values, parity.thresholds, gates).items():
        g = by_metric[metric]
        value, limit = float(parity.values[metric]), float(parity.thresholds[g.threshold])
        out.append(GatedMetric(name=metric, value=value, op=g.op, limit=limit, margin=margin))
    return out


def miss_reason(parity: ParityReport) -> str:
    """`missed its gate on min cosine and neighbour agreement; its probe set missed too`: the
    numbers are in the accuracy column; misses that are not a gated number are quoted."""
    checked = gated_metrics(parity)
    missed = [metric_label(m.name) for m in checked if not m.passed]
    other = [x for x in parity.misses if not any(x.startswith(f"{m.name} ") for m in checked)]
    probe = [x for x in other if x.startswith("probe set")]
    parts = [f"missed its gate on {and_list(missed)}"] if missed else ["missed its gate"]
    parts += [x for x in other if x not in probe]
    if probe:
        parts.append("its probe set missed too")
    return "; ".join(parts)


def accuracy_cost(rec: VariantRecord, sep: str = "; ") -> str:
    """The variant's distance from PyTorch in its gate's own metrics."""
    return sep.join(m.describe() for m in gated_metrics(rec.parity)) or "no gated metric"


# ---------------------------------------------------------------------------- load


def engine_loads(export: ExportResult, records: Sequence[VariantRecord]) -> dict[str, LoadRecord | None]:
    """Per engine (pytorch, then each measured variant), the worst load of its measurements."""
    out = {"pytorch": load_of(export.torch_latency.values())}
    for rec in records:
        if rec.benchmark:
            out[rec.variant_id] = load_of(rec.benchmark.shapes.values())
    return out


def load_cell(load: LoadRecord | None) -> str:
    """`0.4/core`, `3.1/core LOADED`, or `-` when not recorded."""
    return load.short() if load else "-"


def load_verdict(export: ExportResult, records: Sequence[VariantRecord]) -> tuple[str, bool]:
    """One sentence on the load the timings ran under, and whether any was contaminated."""
    loads = engine_loads(export, records)
    contaminated = [name for name, load in loads.items() if load is not None and load.contaminated]
    worst = worst_load(loads.values())
    if worst is None:
        bench = next((r.benchmark for r in records if r.benchmark and r.benchmark.load_average is not None), None)
        average = f" (1-minute load average {bench.load_average:.2f})" if bench and bench.load_average else ""
        return f"Load was not recorded per measurement{average}.", False
    if contaminated:
        return f"{worst.describe().capitalize()} ({', '.join(contaminated)}).", True
    return f"{worst.describe().capitalize()}.", False


def measured_under(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    """The CPU and load the latencies were measured under (a shared machine drifts)."""
    bench = next((r.benchmark for r in records if r.benchmark and r.benchmark.hardware), None)
    if bench is None:
        return "No variant was benchmarked."
    hw = bench.hardware
    threads = "one ONNX Runtime thread per core" if not bench.threads else f"{bench.threads} ONNX Runtime threads"
    interleaved = all("torch_p50_ms" in s for r in records if r.benchmark for s in r.benchmark.shapes.values())
    torch = (
        "PyTorch timed in alternate rounds with each variant"
        if interleaved
        else "PyTorch timed at export, not alongside the variants"
    )
    return (
        f"Latency measured on {hw['cpu_model']} ({hw['int8_kernel']} int8 kernels, {hw['cores']} cores, "
        f"{threads}); {torch}. Compare ratios within one build, not across machines."
    )


def load_line(export: ExportResult, records: Sequence[VariantRecord]) -> str:
    """The load sentence on its own line, a warning when any timing was contaminated."""
    text, loaded = load_verdict(export, records)
    return f"WARNING: {text}" if loaded else text


# ---------------------------------------------------------------------------- the serving choice


@dataclass(frozen=True, kw_only=True)
class Alternative:
    """A variant the server does not pick first, and why."""

    record: VariantRecord
    reason: str


@dataclass(frozen=True, kw_only=True)
class ServingChoice:
    """What `--variant auto` serves on one kind of machine, why, and why not each other variant."""

    where: str
    chosen: VariantRecord | None
    why: str
    alternatives: tuple[Alternative, ...]


def _hardware(recorded: dict[str, Any]) -> HardwareInfo:
    fields = {k: v for k, v in recorded.items() if k != "int8_kernel"}
    return HardwareInfo(**fields | {"features": tuple(recorded["features"])})


def _as_variants(records: Sequence[VariantRecord]) -> list[Variant]:
    """The manifest entries the package step writes for these (passed) variants."""
    from ortpack.components.core.package import variant_record
    from ortpack.kernel.bundle import Variant

    return [Variant.model_validate(variant_record(r.built, r.parity, r.benchmark)) for r in records]


def _ranked_by_speed(candidates: Sequence[Variant], hardware: HardwareInfo) -> bool:
    """True when the server ranks these by their benchmark: each was measured on this kind of CPU."""
    return all(measured_p50(v, hardware) is not None for v in candidates)


def _p50(rec: VariantRecord, shape: str) -> str:
    return format_ms(rec.benchmark.shapes[shape]["p50_ms"]) if rec.benchmark and shape in rec.benchmark.shapes else "-"


def _speed(rec: VariantRecord, shape: str) -> str:
    """`3.35 ms at batch 1 × 16 tokens, 7.1× PyTorch`."""
    ratio = rec.benchmark.speedup_vs_torch.get(shape) if rec.benchmark else None
    return f"{_p50(rec, shape)} at {shape_label(shape)}" + (f", {format_ratio(ratio)} PyTorch" if ratio else "")


@dataclass(frozen=True, kw_only=True)
class _Ranking:
    """The server's order over the passed variants on one machine, and what it ranked them by."""

    order: list[Variant]
    chosen: VariantRecord | None
    by_speed: bool  # by this build's benchmark (measured on this kind of CPU), else by preference
    shape: str  # the benchmark shape the server compares: the first

    @property
    def preference(self) -> str:
        return ", then ".join(PREFERENCE[self.order[0].target]) if self.order else ""

    def why(self) -> str:
        if self.chosen is None:
            return "no variant that passed its gate runs here"
        target = self.chosen.built.target
        speed = _speed(self.chosen, self.shape) if self.by_speed and self.shape else ""
        if sum(v.target == target for v in self.order) == 1:
            return f"the only {target} variant that passed its gate" + (f" ({speed})" if speed else "")
        if self.by_speed:
            return f"the fastest here by this build's benchmark: {speed}"
        return f"first in the server's preference order ({self.preference}): no benchmark from this kind of CPU"

    def why_not(self, rec: VariantRecord) -> str:
        if not rec.passed:
            return miss_reason(rec.parity)
        place = next((i for i, v in enumerate(self.order) if v.id == rec.variant_id), None)
        if place is None or self.chosen is None:
            return f"not for this hardware: needs {TARGET_PROVIDER.get(rec.built.target, rec.built.target)} (none here)"
        first = self.chosen
        if rec.built.target != first.built.target:
            return f"fallback #{place}: a {rec.built.target} variant, tried after the {first.built.target} ones"
        if self.by_speed:
            return (
                f"slower here: {_p50(rec, self.shape)} against {_p50(first, self.shape)} at "
                f"{shape_label(self.shape)}; fallback #{place} if {first.variant_id} misses its probe check on the node"
            )
        return f"later in the preference order ({self.preference}); fallback #{place}"


def _rank(records: Sequence[VariantRecord], providers: Sequence[str], hardware: HardwareInfo) -> _Ranking:
    order = rank_variants(_as_variants([r for r in records if r.passed]), providers, hardware)
    if not order:
        return _Ranking(order=[], chosen=None, by_speed=False, shape="")
    first = order[0]
    return _Ranking(
        order=order,
        chosen=next(r for r in records if r.variant_id == first.id),
        by_speed=_ranked_by_speed([v for v in order if v.target == first.target], hardware),
        shape=next(iter(first.benchmark.shapes), ""),
    )


def serving_choice(
    records: Sequence[VariantRecord], providers: Sequence[str], hardware: HardwareInfo, where: str
) -> ServingChoice:
    """Apply the server's ranking (`ortpack.kernel.selection.rank_variants`) to this build's variants on a
    machine with `providers` and `hardware`, and say why each other variant comes later or never."""
    ranking = _rank(records, providers, hardware)
    alternatives = tuple(Alternative(record=r, reason=ranking.why_not(r)) for r in records if r is not ranking.chosen)
    return ServingChoice(where=where, chosen=ranking.chosen, why=ranking.why(), alternatives=alternatives)


def build_machine(records: Sequence[VariantRecord]) -> tuple[list[str], HardwareInfo | None]:
    """The providers and CPU this build's gates ran with: a server here has the same."""
    providers = sorted({CPU_PROVIDER, *(r.parity.validated_on for r in records)})
    recorded = next((r.parity.hardware for r in records if r.parity.hardware), None)
    return providers, _hardware(recorded) if recorded else None


def choice_here(records: Sequence[VariantRecord]) -> ServingChoice:
    """What a server on this build's machine serves."""
    providers, here = build_machine(records)
    if here is None:
        unknown = HardwareInfo(machine="", cpu_model="unknown", features=(), cores=1)
        return serving_choice(records, providers, unknown, "this build's machine")
    return serving_choice(records, providers, here, f"this build's machine, {here.summary()}")


def choices_elsewhere(records: Sequence[VariantRecord]) -> list[ServingChoice]:
    """The same ranking on the other machines this build's variants may meet: a GPU node (when a
    cuda variant passed and this machine has no CUDA provider), a CPU with fewer ISA features."""
    providers, here = build_machine(records)
    out = []
    cuda = TARGETS["cuda"]
    if cuda.provider not in providers and any(r.passed and r.built.target == cuda.name for r in records):
        gpu = list(cuda.execution_providers)
        out.append(
            serving_choice(
                records, gpu, here or HardwareInfo(machine="", cpu_model="", features=(), cores=1), "a GPU node"
            )
        )
    if here is not None and not set(here.features) <= set(BASELINE_FEATURES):
        baseline = HardwareInfo(machine=here.machine, cpu_model="", features=BASELINE_FEATURES, cores=here.cores)
        out.append(serving_choice(records, [CPU_PROVIDER], baseline, "a CPU with fewer ISA features (AVX2 only)"))
    return out


def verdict(records: Sequence[VariantRecord]) -> list[str]:
    """The verdict as text lines: what a server here serves and why, why not each other variant,
    and what other machines serve."""
    if not any(r.passed for r in records):
        return ["No variant passed its gate: nothing ships."]
    here = choice_here(records)
    chosen = here.chosen.variant_id if here.chosen else "nothing"
    lines = [f"Verdict: on {here.where}, --variant auto serves {chosen}: {here.why}."]
    if here.chosen:
        lines.append(f"  against PyTorch: {accuracy_cost(here.chosen)}.")
    lines += [f"  not {a.record.variant_id}: {a.reason}." for a in here.alternatives]
    for other in choices_elsewhere(records):
        lines.append(f"  on {other.where}: {other.chosen.variant_id if other.chosen else 'nothing'} ({other.why}).")
    return lines


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
                *(_p50(rec, s) for s in shapes),
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
    machine = _hardware(hw).summary() if hw else "an unrecorded machine"
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
    """Per shape, p50 bars and p95 ticks, PyTorch first; each label gives the speed-up the
    benchmark recorded (against PyTorch timed alongside the variant where it was)."""
    import matplotlib.pyplot as plt

    shapes = list(export.torch_latency)
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.2 * len(shapes), 3.4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        torch = export.torch_latency[shape]
        names, p50, p95, ratios = ["pytorch"], [torch["p50_ms"]], [torch["p95_ms"]], [1.0]
        for rec in records:
            if rec.benchmark and shape in rec.benchmark.shapes:
                names.append(rec.variant_id)
                p50.append(rec.benchmark.shapes[shape]["p50_ms"])
                p95.append(rec.benchmark.shapes[shape]["p95_ms"])
                ratios.append(rec.benchmark.speedup_vs_torch.get(shape, torch["p50_ms"] / p50[-1]))
        ypos = range(len(names))
        ax.barh(ypos, p50, color=[_colour(n) for n in names], label="p50")
        ax.scatter(p95, ypos, marker="|", s=300, color="black", label="p95", zorder=3)
        for y, (a, b, ratio) in enumerate(zip(p50, p95, ratios, strict=True)):
            ax.text(b, y, f"  {format_ms(a)} ({format_ratio(ratio)})", va="center", fontsize=8)
        ax.set_yticks(list(ypos), names)
        ax.invert_yaxis()
        ax.set_xlim(0, max(p95) * 1.6)
        ax.set_xlabel("latency, ms (bar p50, tick p95)")
        ax.set_title(shape_label(shape))
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
                _p50(alt.record, shape),
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
    """Per int8 variant whose recipe was chosen among several, the table of every candidate
    (components/core/int8_search.py): what each measured, its size and speed, which shipped."""
    from ortpack.components.core.int8_search import table

    parts = []
    for rec in records:
        record = rec.built.metrics.get("int8") or {}
        rows = table(record)
        if len(rows) < 2:
            continue
        # the image tasks take the first recipe within the int8 gate, the recipes fastest first
        rule = str(record.get("rule") or "the first within the int8 gate, the recipes ordered fastest first")
        variant = html.escape(rec.variant_id)
        parts += [
            f"<h2 id='int8-search-{variant}'>int8 recipe search: {variant}</h2>",
            f"<p>Every candidate was built and measured; the winner is {html.escape(rule)}. Latency: each "
            "candidate's fastest call in ms, one thread, the candidates interleaved. The validate step then "
            "gates the winner on the whole validation set.</p>",
            _table(rows),
        ]
    return parts


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
