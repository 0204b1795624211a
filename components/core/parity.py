"""Step 3: the parity gate. Compare a variant with the PyTorch reference outputs.

Read-only and thorough: input/output names, dtypes and dynamic axes first, then values at batch
size 1 (unpadded) and at a padded batch (a frozen batch axis or a padding bug shows up there),
on the shipped validation set. Every miss is collected, the numbers are kept, and only then does
the caller decide (`ParityReport.raise_if_failed`). Needs only ONNX Runtime and numpy.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ortpack.components.core.artifacts import ExportResult, OptimizeResult, ParityReport, export_engine
from ortpack.components.core.errors import one_line
from ortpack.components.core.reference import Reference
from ortpack.components.core.specs import ParityThresholds, get_target
from ortpack.components.core.tasks import get_family
from ortpack.kernel.engines import get_engine
from ortpack.kernel.hardware import this_machine
from ortpack.kernel.probe import PROBE_FILE, Probe, check_probe
from ortpack.kernel.runtime import SessionPlan, create_session, plan_for

log = logging.getLogger("ortpack.validate")


def check_parity(
    model_path: Path,
    reference_path: Path,
    thresholds: ParityThresholds,
    *,
    variant_id: str,
    plan: SessionPlan | None = None,
) -> ParityReport:
    """Compare the variant at `model_path` with the PyTorch reference; return every number.

    The graph's tensors are checked against the task's declaration (its contract's signature), the
    task family (from the reference) compares its outputs; this gates them. Never raises on a
    miss: call `raise_if_failed()` on the report after logging it.
    """

    reference_path = Path(reference_path)
    ref = Reference.load(reference_path)
    task = str(ref["task"])
    family = get_family(task)
    signature = ExportResult.load(reference_path.parent).signature()

    def report(values: dict[str, float], misses: list[str], validated_on: str, samples: int, **kw: Any) -> ParityReport:
        return ParityReport(
            variant_id=variant_id,
            task=task,
            thresholds=thresholds.as_dict(),
            values=values,
            misses=misses,
            validated_on=validated_on,
            samples=samples,
            **kw,
        )

    try:
        plan = plan or SessionPlan(
            providers=["CPUExecutionProvider"], online_optimization=True, reason="no build record"
        )
        session = create_session(Path(model_path), plan)
    except Exception as exc:  # noqa: BLE001 - a graph ORT cannot load is a miss, not a crash
        return report({}, [f"ONNX Runtime cannot load the model: {one_line(exc, 300)}"], "none", 0)
    validated_on = session.get_providers()[0]
    misses = signature.check_graph(session.get_inputs(), session.get_outputs())
    if misses:
        return report({}, misses, validated_on, 0)
    log.info("validate %s: %s on %s", variant_id, family.report.unit, validated_on)
    compared = family.compare(session, ref, reference_path.parent)
    result = report(
        compared.values,
        [*compared.misses, *thresholds.misses(compared.values)] if compared.samples else compared.misses,
        validated_on,
        compared.samples,
        per_item=compared.per_item,
    )
    shown = ", ".join(
        f"{metric} {result.values[metric]:{fmt}}" for _, metric, fmt in family.report.columns if metric in result.values
    )
    log.info("validate %s: %s (%s)", variant_id, "PASS" if result.passed else "MISS", shown)
    return result


def probe_on_this_machine(
    export: ExportResult,
    export_dir: Path,
    model_path: Path,
    plan: SessionPlan,
    thresholds: ParityThresholds,
    variant_id: str,
) -> dict[str, Any]:
    """The bundle's probe check (ortpack.kernel.probe) on this machine, run exactly as a serving
    node runs it: a serving session (one thread, no spinning) and the task's engine (the shipped
    tokenizer, the server's image decoder), batch 1. Empty when the export has no probe set."""

    export_dir = Path(export_dir)
    probe_path = export_dir / PROBE_FILE
    if not probe_path.is_file():
        return {}
    session = create_session(model_path, plan, intra_op_threads=1, allow_spinning=False)
    names = [o.name for o in export.signature().outputs]
    result = check_probe(
        Probe.from_bytes(probe_path.read_bytes(), names),
        export_engine(export, export_dir, session),
        thresholds.as_dict(),
        get_engine(export.task).probe_metrics,
        gates=thresholds.gates,
        variant_id=variant_id,
        provider=session.get_providers()[0],
        hardware=this_machine().as_dict(),
    )
    log.info("validate %s: probe of %d on this machine: %s", variant_id, result.samples, result.summary())
    return result.as_dict()


def validate_variant(
    variant_dir: Path,
    export_dir: Path,
    thresholds: ParityThresholds,
    *,
    out_dir: Path | None = None,
    allow_off_target: bool = False,
) -> ParityReport:
    """Check the variant built by `optimize_model` in `variant_dir`; save `parity.json` in
    `out_dir` (default: `variant_dir`).

    Beyond the gate on the validation set: the probe set must pass on this machine too (every
    serving node repeats that check), and a variant checked on another execution provider than
    its target's (a cuda variant where onnxruntime has no CUDA provider) misses unless
    `allow_off_target`; the report then says so."""
    import dataclasses

    built = OptimizeResult.load(variant_dir)
    export = ExportResult.load(export_dir)
    plan = plan_for(built)
    model_path = Path(variant_dir) / built.model_file
    report = check_parity(
        model_path,
        Path(export_dir) / export.reference_file,
        thresholds,
        variant_id=built.variant_id,
        plan=plan,
    )
    misses = list(report.misses)
    probe: dict[str, Any] = {}
    if report.samples:  # the graph loaded and has the right signature
        probe = probe_on_this_machine(export, Path(export_dir), model_path, plan, thresholds, built.variant_id)
        if probe and not probe["passed"]:
            misses.append("probe set on this machine: " + "; ".join(probe["misses"]))
    wanted = get_target(built.target).execution_providers[0]
    off_target = bool(report.samples) and report.validated_on != wanted
    if off_target and not allow_off_target:
        misses.append(
            f"validated on {report.validated_on}, not on its target's {wanted} (this onnxruntime lacks it; "
            "--allow-off-target-validation ships it anyway)"
        )
    report = dataclasses.replace(
        report, misses=misses, probe=probe, off_target=off_target, hardware=this_machine().as_dict()
    )
    target_dir = Path(out_dir) if out_dir else Path(variant_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    report.save(target_dir)
    return report
