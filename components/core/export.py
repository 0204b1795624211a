"""Step 1: export a model to ONNX with its pre/post-processing in the graph."""

from __future__ import annotations

import logging
from pathlib import Path

from components.core.artifacts import ExportResult
from components.core.specs import ExportSpec

log = logging.getLogger("ortpack.export")


def export_model(spec: ExportSpec, out_dir: Path) -> ExportResult:
    """Export `spec.source` for `spec.task` into `out_dir` (model.onnx, reference.npz, export.json,
    and the tokenizer for text models)."""
    from components.core.exporters import get_exporter

    exporter = get_exporter(spec.task)
    result = exporter(spec, Path(out_dir))
    log.info(
        "export: %d nodes, %.1f MB in %.1f s",
        result.metrics["nodes"],
        result.metrics["mb"],
        result.metrics["seconds"],
    )
    return result
