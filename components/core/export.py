"""Step 1: export a model to ONNX with its pre/post-processing in the graph.

After the task's exporter has written the graph and the PyTorch reference outputs, two checks
and one selection are the same for every task:

- a reference whose outputs barely vary (random torchvision weights give every class ~0.001)
  makes every parity check vacuous: it is refused unless the spec allows it;
- the probe set (kernel/probe.py) is picked from the validation set with its reference outputs:
  a small, varied subset every serving node replays before it turns ready.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ortpack.components.core.artifacts import ExportResult
from ortpack.components.core.errors import ExportError
from ortpack.components.core.reference import Reference
from ortpack.components.core.specs import ExportSpec
from ortpack.components.core.tasks import check_export_spec, get_family
from ortpack.kernel.bundle import BundleError, check_task_settings
from ortpack.kernel.probe import PROBE_FILE

log = logging.getLogger("ortpack.export")

# Spread (see `output_spread`) below which a reference is degenerate. Measured: MobileNetV3-small
# with torchvision's random weights 0.0 (every image gets the same ~0.001 per class); the same
# network with re-estimated BatchNorm statistics and a scaled head (tests/models.py) 0.999; the
# tiny random-weight encoders of bench/results/coverage.json 0.74-1.79 (BERT 0.99);
# all-MiniLM-L6-v2 1.38.
MIN_SPREAD = 0.05


def output_spread(outputs: np.ndarray) -> float:
    """How much the reference outputs vary across inputs, relative to their size: the largest
    range of one output across samples over the largest |value|. 0 when every input gives the
    same outputs."""
    out = outputs.astype(np.float64)
    scale = float(np.abs(out).max())
    if not np.isfinite(scale) or scale == 0.0:
        return 0.0
    return float(np.ptp(out, axis=0).max() / scale)


def _write_probe(export: ExportResult, out_dir: Path) -> str:
    """Write the task's probe set (kernel/probe.py) into the export; return its path there."""

    probe = get_family(export.task).select_probe(export, out_dir)
    path = out_dir / PROBE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(probe.to_bytes())
    return PROBE_FILE


def export_model(
    spec: ExportSpec, out_dir: Path, *, source: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> ExportResult:
    """Export `spec.source` for `spec.task` into `out_dir` (model.onnx, reference.npz, the probe
    set, the tokenizer for text models, and export.json, written once, last: the exporter returns
    its record and this adds the probe and the reference's spread, and `source` completes the
    manifest's source record with what the caller knows better: the URI a checkpoint was fetched
    from, its revision)."""

    check_export_spec(spec)  # the task and the options it reads, before any work
    out_dir = Path(out_dir)
    result = get_family(spec.task).export(spec, out_dir)
    try:  # the manifest's task section is checked where the facts are born, not at package time
        check_task_settings(result.task, result.task_settings)
    except BundleError as exc:
        raise ExportError(f"the {spec.task} exporter wrote an invalid manifest section: {exc}") from None
    ref = Reference.load(out_dir / result.reference_file)
    spread = output_spread(ref["outputs"])
    if spread < MIN_SPREAD:
        message = (
            f"the PyTorch reference is degenerate: its outputs barely vary across the validation set "
            f"(spread {spread:.3g}, needs >= {MIN_SPREAD}), so every parity check would pass; "
            "are the weights random? (--allow-degenerate-reference to build anyway)"
        )
        if not spec.allow_degenerate_reference:
            raise ExportError(message)
        log.warning("export: %s", message)
    probe_file = _write_probe(result, out_dir)
    result = dataclasses.replace(
        result,
        metrics={**result.metrics, "reference_spread": spread},
        degenerate_reference=spread < MIN_SPREAD,
        extra_files=[*result.extra_files, probe_file],
        source=source(dict(result.source)) if source is not None else result.source,
    )
    result.save(out_dir)
    log.info(
        "export: %d nodes, %.1f MB in %.1f s",
        result.metrics["nodes"],
        result.metrics["mb"],
        result.metrics["seconds"],
    )
    return result
