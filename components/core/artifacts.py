"""Result dataclasses of each step, and how they persist beside the files they describe.

Every step writes into its own directory: its files plus one JSON record (`export.json`,
`optimize.json`, `parity.json`, `benchmark.json`). That directory is the step's KFP artifact, so
the next step needs only the path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ortpack.components.core.errors import ParityError
from ortpack.kernel.bundle import DATA_SUFFIX, check_task_settings
from ortpack.kernel.contracts import get_contract
from ortpack.kernel.engine import Engine, EngineContext
from ortpack.kernel.engines import get_engine

if TYPE_CHECKING:
    from ortpack.kernel.contracts import TaskSettings
    from ortpack.kernel.contracts.tensors import Signature


class _Record:
    """Save/load a dataclass as `<dir>/<FILE>`."""

    FILE = ""

    def save(self, directory: Path) -> Path:
        path = Path(directory) / self.FILE
        # no sort_keys: insertion order is meaningful (benchmark shapes, small to large)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")  # type: ignore[call-overload]
        return path

    @classmethod
    def load(cls, directory: Path) -> Self:
        path = Path(directory) / cls.FILE
        if not path.is_file():
            raise ValueError(f"{directory} is not a {cls.__name__} directory (no {cls.FILE})")
        raw = json.loads(path.read_text())
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class ExportResult(_Record):
    """A raw ONNX export, its tokenizer, and the PyTorch reference outputs for parity."""

    FILE = "export.json"

    task: str
    name: str
    source: dict[str, Any]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    opset: int
    model_info: dict[str, Any]
    metrics: dict[str, float]
    torch_latency: dict[str, dict[str, float]]
    versions: dict[str, str]
    model_file: str = "model.onnx"
    reference_file: str = "reference.npz"
    # the task's manifest section (kernel/contracts/<task>.py), checked when the export is written
    task_settings: dict[str, Any] = field(default_factory=dict)
    extra_files: list[str] = field(default_factory=list)
    # True when the reference was degenerate and the user allowed it (the report shows a banner)
    degenerate_reference: bool = False

    def settings(self) -> TaskSettings:
        """The task section, checked against its task's manifest model (ortpack.kernel.contracts)."""

        return check_task_settings(self.task, self.task_settings)

    def signature(self) -> Signature:
        """The task's tensors for this export (its contract's declaration for its section)."""

        return get_contract(self.task).signature(self.settings())

    def sizes(self) -> dict[str, int]:
        """The named dimensions the graph fixes ({"dim": 384})."""
        return self.signature().sizes([*self.inputs, *self.outputs])

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest fields an export determines (everything but variants and files)."""
        return {
            "name": self.name,
            "source": self.source,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "task_settings": {**self.task_settings, "task": self.task},
        }


@dataclass(frozen=True, kw_only=True)
class OptimizeResult(_Record):
    """One variant's optimized graph and what it was built for."""

    FILE = "optimize.json"

    variant_id: str
    target: str
    precision: str
    execution_providers: list[str]
    ort_version: str
    opset: int
    offline_optimization_level: str
    metrics: dict[str, Any]
    model_file: str = "model.onnx"
    online_optimization_level: str = "all"  # what the server should ask ORT for at load (measured)


@dataclass(frozen=True, kw_only=True)
class ParityReport(_Record):
    """The parity numbers of one variant against PyTorch, and the gate's verdict."""

    FILE = "parity.json"

    variant_id: str
    task: str
    thresholds: dict[str, float]
    values: dict[str, float]
    misses: list[str]
    validated_on: str  # the execution provider that actually ran the check
    samples: int
    per_item: dict[str, list[float]] = field(default_factory=dict)
    # the machine the check ran on (ortpack.kernel.hardware.HardwareInfo.as_dict())
    hardware: dict[str, Any] = field(default_factory=dict)
    # the probe set's check on this machine (ortpack.kernel.probe.ProbeResult.as_dict()): what every
    # serving node repeats before it turns ready
    probe: dict[str, Any] = field(default_factory=dict)
    # validated on another execution provider than the target's (a cuda variant on the CPU
    # provider) and shipped anyway because the user allowed it
    off_target: bool = False

    @property
    def passed(self) -> bool:
        return not self.misses

    def metrics(self) -> dict[str, float]:
        """Flat metric names for KFP (`parity.min_cosine`, ..., `parity.passed`)."""
        out = {f"parity.{k}": float(v) for k, v in self.values.items()}
        out["parity.passed"] = 1.0 if self.passed else 0.0
        if self.probe:
            out.update({f"parity.probe.{k}": float(v) for k, v in self.probe["values"].items()})
            out["parity.probe.passed"] = 1.0 if self.probe["passed"] else 0.0
        out["parity.off_target"] = 1.0 if self.off_target else 0.0
        return out

    def summary(self) -> str:
        if self.passed:
            return f"{self.variant_id}: passed"
        return f"{self.variant_id}: " + "; ".join(self.misses)

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise ParityError(f"parity gate missed by {self.summary()}")


@dataclass(frozen=True, kw_only=True)
class BenchmarkResult(_Record):
    """Latency of one variant per input shape, and its speed-up over PyTorch eager."""

    FILE = "benchmark.json"

    variant_id: str
    execution_providers: list[str]  # the providers the measured session actually ran on
    shapes: dict[str, dict[str, float]]
    speedup_vs_torch: dict[str, float]
    skipped: str | None = None
    hardware: dict[str, Any] = field(default_factory=dict)  # where it was measured
    threads: int = 0  # ONNX Runtime intra-op threads (0: one per core)
    load_average: float | None = None  # 1-minute load average when the measurement started

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for shape, stats in self.shapes.items():
            for stat, value in stats.items():
                out[f"bench.{stat}.{shape}"] = float(value)
        for shape, ratio in self.speedup_vs_torch.items():
            out[f"bench.speedup_vs_torch.{shape}"] = float(ratio)
        return out


@dataclass(frozen=True, kw_only=True)
class VariantRecord:
    """Everything known about one variant: its optimized graph, its gate verdict, its speed."""

    model_dir: Path
    built: OptimizeResult
    parity: ParityReport
    benchmark: BenchmarkResult | None

    @property
    def variant_id(self) -> str:
        return self.built.variant_id

    @property
    def passed(self) -> bool:
        return self.parity.passed

    @classmethod
    def load(cls, directory: Path) -> VariantRecord:
        """Read a directory holding optimize.json, parity.json and (if measured) benchmark.json."""
        directory = Path(directory)
        bench = BenchmarkResult.load(directory) if (directory / BenchmarkResult.FILE).is_file() else None
        return cls(
            model_dir=directory,
            built=OptimizeResult.load(directory),
            parity=ParityReport.load(directory),
            benchmark=None if bench is None or bench.skipped else bench,
        )


def gather_variant(model_dir: Path, parity_dir: Path, out_dir: Path) -> Path:
    """Put a variant's graph and records in one directory (hard links where the filesystem allows):
    KFP hands each step's outputs over as separate artifacts; packaging wants them together."""
    import os
    import shutil

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = OptimizeResult.load(model_dir)
    data = Path(model_dir) / (built.model_file + DATA_SUFFIX)  # weights beyond 2 GB (components/core/graph_files.py)
    for src in (
        Path(model_dir) / built.model_file,
        *([data] if data.is_file() else []),
        Path(model_dir) / OptimizeResult.FILE,
        Path(parity_dir) / ParityReport.FILE,
    ):
        dst = out_dir / src.name
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)
    return out_dir


def export_engine(export: ExportResult, export_dir: Path, session: Any) -> Engine:
    """The task's engine for a variant of this export, as a serving node opens it: the export's
    section, tensors and shared files (the tokenizer), the default limits, the bundle's default
    image decode (no variant yet: its parity is what is being measured)."""

    files = {name: (Path(export_dir) / name).read_bytes() for name in export.extra_files}
    signature = export.signature()
    context = EngineContext(
        settings=export.settings(), signature=signature, sizes=export.sizes(), session=session, files=files
    )
    return get_engine(export.task).open(context)
