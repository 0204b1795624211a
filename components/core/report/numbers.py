"""How the report words numbers, gates and the load a measurement ran under: latencies, ratios, gated
metrics with their limits, why a variant missed, and the other work on the machine."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ortpack.components.core.artifacts import ExportResult, ParityReport, VariantRecord
from ortpack.components.core.errors import and_list
from ortpack.components.core.timing import LoadRecord, load_of, worst_load
from ortpack.kernel.contracts import get_contract
from ortpack.kernel.gates import margins
from ortpack.kernel.targets import TARGETS

Row = tuple[str, ...]
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
