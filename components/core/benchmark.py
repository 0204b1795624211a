"""Step 4: benchmark one variant (it measures; it never fails a build)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

import numpy as np

from ortpack.components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult
from ortpack.components.core.tasks import get_family
from ortpack.components.core.timing import load_of, measure_interleaved, timed
from ortpack.kernel.hardware import this_machine
from ortpack.kernel.runtime import create_session, plan_for

log = logging.getLogger("ortpack.benchmark")

ORT, TORCH = "onnxruntime", "pytorch"
# Per shape, PyTorch's numbers when it was measured interleaved with the variant (in `shapes`, so
# they travel wherever the variant's stats go; absent: the speed-up is against the export's timing)
TORCH_KEYS = ("p50_ms", "p95_ms")


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """Per benchmark shape (the ones PyTorch was timed at in the export): batch size and inputs."""

    return get_family(export.task).bench_feeds(export)


def torch_p50(export: ExportResult, stats: Mapping[str, float], shape: str) -> float | None:
    """PyTorch's p50 to compare a variant's `stats` with: measured interleaved with it when it was,
    else at export."""
    if "torch_p50_ms" in stats:
        return stats["torch_p50_ms"]
    return export.torch_latency[shape]["p50_ms"] if shape in export.torch_latency else None


def measure_shape(
    run: Callable[[], object], torch_call: Callable[[], object] | None, batch: int, budget_s: float
) -> dict[str, float]:
    """The variant's stats at one shape; with `torch_call`, PyTorch is timed in alternate rounds
    with it and its p50/p95 are added as `torch_p50_ms`/`torch_p95_ms`."""
    timers = {ORT: timed(run)} | ({TORCH: timed(torch_call)} if torch_call else {})
    measured = measure_interleaved(timers, budget_s=budget_s)
    stats = measured[ORT]
    stats["items_per_s"] = batch * 1000.0 / stats["p50_ms"]
    if TORCH in measured:
        stats.update({f"torch_{key}": measured[TORCH][key] for key in TORCH_KEYS})
    return stats


def benchmark_variant(
    variant_dir: Path,
    export_dir: Path,
    *,
    budget_s: float = 3.0,
    out_dir: Path | None = None,
    torch_calls: Mapping[str, Callable[[], object]] | None = None,
) -> BenchmarkResult:
    """Latency of the variant in `variant_dir` at the task's benchmark shapes, loaded the way the
    server loads it, with the load it ran under; speed-up against PyTorch eager, timed in alternate
    rounds with the variant where `torch_calls` gives its call for a shape (the same inputs), else
    the latency measured at export. Saves `benchmark.json` in `out_dir` (default: `variant_dir`)."""
    variant_dir, export_dir = Path(variant_dir), Path(export_dir)
    built = OptimizeResult.load(variant_dir)
    export = ExportResult.load(export_dir)
    plan = plan_for(built)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    session = create_session(variant_dir / built.model_file, plan)
    torch_calls = torch_calls or {}
    shapes = {
        key: measure_shape(partial(session.run, None, feeds), torch_calls.get(key), batch, budget_s)
        for key, (batch, feeds) in bench_feeds(export).items()
    }
    speedup = {key: base / stats["p50_ms"] for key, stats in shapes.items() if (base := torch_p50(export, stats, key))}
    result = BenchmarkResult(
        variant_id=built.variant_id,
        execution_providers=list(session.get_providers()),
        shapes=shapes,
        speedup_vs_torch=speedup,
        hardware=this_machine().as_dict(),
        threads=0,
        load_average=load,
    )
    result.save(Path(out_dir) if out_dir else variant_dir)
    log.info(
        "benchmark %s: %s",
        built.variant_id,
        ", ".join(f"{k} p50 {v['p50_ms']:.2f} ms ({speedup.get(k, 0):.1f}x torch)" for k, v in shapes.items()),
    )
    worst = load_of(shapes.values())
    if worst is not None and worst.contaminated:
        log.warning("benchmark %s: %s", built.variant_id, worst.describe())
    return result
