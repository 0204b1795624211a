"""ONNX Runtime sessions for bundle variants: providers, threads and optimization level.

Shared by the server and the pipeline's validate/benchmark steps, so a variant is measured the
way it is served.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("ortpack.runtime")


@dataclass(frozen=True, kw_only=True)
class SessionPlan:
    """How one session will be created, and why (logged at start-up)."""

    providers: list[str]
    online_optimization: bool
    reason: str


def plan_session(*, wanted_providers: list[str], offline_level: str, built_ort_version: str) -> SessionPlan:
    """Pick providers available here and decide whether ORT must optimize online.

    An offline-optimized graph (level extended/all) is loaded with online optimization disabled
    only when this ORT version and the first execution provider match what it was built for;
    otherwise ORT optimizes it again at load time and we say why.
    """
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers = [p for p in wanted_providers if p in available] or ["CPUExecutionProvider"]
    if offline_level not in ("extended", "all"):
        return SessionPlan(
            providers=providers, online_optimization=True, reason=f"built with offline level {offline_level!r}"
        )
    if built_ort_version != ort.__version__:
        return SessionPlan(
            providers=providers,
            online_optimization=True,
            reason=f"built with onnxruntime {built_ort_version}, running {ort.__version__}",
        )
    if providers[0] != wanted_providers[0]:
        return SessionPlan(
            providers=providers,
            online_optimization=True,
            reason=f"built for {wanted_providers[0]}, running on {providers[0]}",
        )
    return SessionPlan(
        providers=providers, online_optimization=False, reason="offline-optimized for this onnxruntime and provider"
    )


def create_session(
    model_path: Path,
    plan: SessionPlan,
    *,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
) -> Any:
    """An `InferenceSession` following `plan`. `intra_op_threads=0` lets ORT use every core."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if plan.online_optimization
        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not allow_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if plan.online_optimization:
        log.warning("optimizing %s online: %s", Path(model_path).name, plan.reason)
    return ort.InferenceSession(str(model_path), options, providers=plan.providers)
