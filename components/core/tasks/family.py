"""The shape of a task family (`TaskFamily`) and the values its functions return.

A leaf of the task package: the family modules (text_embedding.py, ...) import these types, and
the registry in `ortpack.components.core.tasks` imports the family modules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from ortpack.components.core.artifacts import ExportResult
    from ortpack.components.core.specs import ExportSpec, ParityThresholds
    from ortpack.kernel.probe import Probe


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """A variant's outputs against PyTorch's on the validation set: every number, per-item
    distances for the report, how many samples, and misses that are not thresholds (NaN rows)."""

    values: dict[str, float]
    per_item: dict[str, list[float]]
    samples: int
    misses: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class ReportSpec:
    """How the report shows a task: summary columns (header, metric, format), the per-item
    distance plot (per_item key, axis label, how the gate's threshold maps onto that axis) and
    the agreement plot (per_item key, k, axis label)."""

    columns: tuple[tuple[str, str, str], ...]
    distance: tuple[str, str, Callable[[dict[str, float]], float | None]]
    agreement: tuple[str, int, str]
    unit: str  # "sentences", "images", ...
    # a table of the task's own speed numbers (rows, a header first) the report shows after its
    # summary: (export, the variants' records) -> rows; a decoder's tokens per second
    speed: Callable[[ExportResult, Sequence[Any]], list[list[str]]] | None = None


@dataclass(frozen=True, kw_only=True)
class TaskFamily:
    name: str
    description: str
    resolve_source: Callable[[str], tuple[str, str]]  # user's --model -> (source, default bundle name)
    export: Callable[[ExportSpec, Path], ExportResult]
    thresholds: dict[str, ParityThresholds]  # default gate per precision
    # (session, reference npz, export dir); the graph's signature is checked before, against the
    # contract's declaration (ortpack.kernel.contracts.tensors)
    compare: Callable[[Any, Any, Path], Comparison]
    bench_feeds: Callable[[ExportResult], dict[str, tuple[int, dict[str, np.ndarray]]]]
    # (fused fp32 graph, int8 graph to write, export, export dir, pinned recipe or None): the int8
    # recipe, which may read the export (its model_type, its calibration data); may return what it
    # chose and measured (the optimize step's `int8` metrics)
    quantize_int8: Callable[[Path, Path, ExportResult, Path, str | None], dict[str, Any] | None]
    select_probe: Callable[[ExportResult, Path], Probe]
    report: ReportSpec
    # A task that quantizes weights only (decoders: MatMulNBits) builds its int8 and int4 variants here
    # instead of `quantize_int8`: (graph, quantized graph to write, export, export dir, precision, the
    # build's gate for it with the user's overrides, pinned recipe or None) -> what it chose and measured
    # (the optimize step's `int8`/`int4` metrics). None: the task has no int4 variant.
    quantize_weight_only: (
        Callable[[Path, Path, ExportResult, Path, str, ParityThresholds, str | None], dict[str, Any]] | None
    ) = None
    # transformer fusions before the precision conversion:
    # (raw path, export, gpu) -> (OnnxModel, fused operator counts, the fuser that ran)
    fuse: Callable[[Path, ExportResult, bool], tuple[Any, dict[str, int], str]] | None = None
    # the int8 recipes a build may pin by name (components/core/quantization/recipes.py; empty: none)
    int8_recipes: tuple[str, ...] = ()
    # a task with an embedding space (its contract's declaration): the inputs `ortpack bundle diff`
    # and the pipeline's baseline check (components/core/compat.py) search with by default,
    # () -> (queries, documents)
    retrieval_set: Callable[[], tuple[tuple[Any, ...], tuple[Any, ...]]] | None = None
