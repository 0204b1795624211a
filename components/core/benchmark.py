"""Step 4: benchmark one variant (it measures; it never fails a build)."""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path

import numpy as np

from components.core.artifacts import BenchmarkResult, ExportResult, OptimizeResult
from components.core.timing import measure_latency
from serving.hardware import this_machine
from serving.runtime import create_session, plan_for

log = logging.getLogger("ortpack.benchmark")


def bench_feeds(export: ExportResult) -> dict[str, tuple[int, dict[str, np.ndarray]]]:
    """Per benchmark shape (the ones PyTorch was timed at in the export): batch size and inputs."""
    from components.core.tasks import get_family

    return get_family(export.task).bench_feeds(export)


def benchmark_variant(
    variant_dir: Path, export_dir: Path, *, budget_s: float = 3.0, out_dir: Path | None = None
) -> BenchmarkResult:
    """Latency of the variant in `variant_dir` at the task's benchmark shapes, loaded the way the
    server loads it; speed-up against the PyTorch eager latency measured at export. Saves
    `benchmark.json` in `out_dir` (default: `variant_dir`)."""
    variant_dir, export_dir = Path(variant_dir), Path(export_dir)
    built = OptimizeResult.load(variant_dir)
    export = ExportResult.load(export_dir)
    plan = plan_for(built)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    session = create_session(variant_dir / built.model_file, plan)
    shapes: dict[str, dict[str, float]] = {}
    for key, (batch, feeds) in bench_feeds(export).items():
        stats = measure_latency(partial(session.run, None, feeds), budget_s=budget_s)
        stats["items_per_s"] = batch * 1000.0 / stats["p50_ms"]
        shapes[key] = stats
    speedup = {
        key: export.torch_latency[key]["p50_ms"] / stats["p50_ms"]
        for key, stats in shapes.items()
        if key in export.torch_latency
    }
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
    return result
