"""The report's plots as inline PNGs (matplotlib, imported when a report is drawn): latency per
shape, per-item distance and agreement against PyTorch, sizes."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from ortpack.components.core.artifacts import ExportResult, VariantRecord
from ortpack.components.core.report.numbers import format_ms, format_ratio, shape_label
from ortpack.components.core.tasks.family import ReportSpec

_COLOURS = {"pytorch": "#7f7f7f", "fp32": "#1f77b4", "fp16": "#2ca02c", "int8": "#d62728"}


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
