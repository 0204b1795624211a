"""ONNX Runtime sessions for bundle variants: providers, threads and optimization level.

Shared by the server, the pipeline's validate/benchmark steps and `bundle diff`, so a variant is
measured the way it is served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("ortpack.runtime")


@dataclass(frozen=True, kw_only=True)
class SessionPlan:
    """How one session will be created, and why (logged at start-up)."""

    providers: list[str]
    online_optimization: bool
    reason: str
    fallback: bool = False  # online optimization because the build does not match this runtime


def plan_session(
    *, wanted_providers: list[str], offline_level: str, built_ort_version: str, online_level: str = "disabled"
) -> SessionPlan:
    """Pick providers available here and decide how much ORT optimizes at load.

    An offline-optimized graph (level extended/all) is loaded at `online_level`, what the build
    measured to run it faster ("disabled", or "all" for the CPU layout transformations that are
    never shipped), when this ORT version and the first execution provider match what it was
    built for; otherwise ORT optimizes it fully at load time, and the plan says why.
    """
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers = [p for p in wanted_providers if p in available] or ["CPUExecutionProvider"]
    mismatch = None
    if offline_level not in ("extended", "all"):
        mismatch = f"built with offline level {offline_level!r}"
    elif built_ort_version != ort.__version__:
        mismatch = f"built with onnxruntime {built_ort_version}, running {ort.__version__}"
    elif providers[0] != wanted_providers[0]:
        mismatch = f"built for {wanted_providers[0]}, running on {providers[0]}"
    if mismatch is not None:
        return SessionPlan(providers=providers, online_optimization=True, reason=mismatch, fallback=True)
    matched = "offline-optimized for this onnxruntime and provider"
    if online_level == "all":
        return SessionPlan(
            providers=providers, online_optimization=True, reason=f"{matched}; layout optimizations at load"
        )
    return SessionPlan(providers=providers, online_optimization=False, reason=matched)


class BuildRecord(Protocol):
    """What a variant was built for: a pipeline OptimizeResult or a manifest Variant."""

    @property
    def execution_providers(self) -> list[str]: ...
    @property
    def offline_optimization_level(self) -> str: ...
    @property
    def ort_version(self) -> str: ...
    @property
    def online_optimization_level(self) -> str: ...


def plan_for(built: BuildRecord) -> SessionPlan:
    """`plan_session` for a variant's build record."""
    return plan_session(
        wanted_providers=built.execution_providers,
        offline_level=built.offline_optimization_level,
        built_ort_version=built.ort_version,
        online_level=built.online_optimization_level,
    )


# ONNX Runtime graph transformers ortpack never runs (offline, at build, or online, at load).
# WeightBiasQuantization gives a float Conv/Gemm that sits between a DequantizeLinear and a
# QuantizeLinear per-tensor 8-bit weights of its own; static int8 keeps depthwise convolutions in
# float on purpose (components/core/optimize.py), and 8-bit weights saturate without VNNI.
DISABLED_OPTIMIZERS = ["WeightBiasQuantization"]


def create_session(
    model: Path | bytes,
    plan: SessionPlan,
    *,
    intra_op_threads: int = 0,
    allow_spinning: bool = True,
    shared_arena: bool = False,
    arena: bool = True,
    data: Mapping[str, bytes] | None = None,
) -> Any:
    """An `InferenceSession` following `plan` for a model file or the model's bytes (the server
    passes the bytes it verified; `data`: its weights file's bytes by the name the graph gives it,
    for a graph whose weights live beside it). `intra_op_threads=0` lets ORT use every core;
    `shared_arena`: the process's CPU arena (`share_cpu_arena`)."""
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
    if shared_arena:
        share_cpu_arena(options)
    if not arena:
        options.enable_cpu_mem_arena = False
    if data:
        names = list(data)
        options.add_external_initializers_from_files_in_memory(
            names, [data[n] for n in names], [len(data[n]) for n in names]
        )
    if plan.fallback:
        log.warning("optimizing the model online: %s", plan.reason)
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=plan.providers, disabled_optimizers=DISABLED_OPTIMIZERS)


_ARENA_LOCK = threading.Lock()
_arena_registered = False  # the process's CPU arena (`share_cpu_arena`)


def share_cpu_arena(options: Any) -> None:
    """Let a session allocate from the process's one CPU arena (registered on first use) instead of
    an arena of its own, grown by exactly what a call asks beyond it (`kSameAsRequested`). A
    session's arena grows to the most it has run at once and keeps it, so two sessions of one
    model kept twice that: measured with two MobileNetV3-small sessions after one 12 MP photo each,
    +279 MB resident with their own arenas, +135 MB with the shared one (no slower per call)."""
    import onnxruntime as ort

    global _arena_registered
    with _ARENA_LOCK:
        if not _arena_registered:
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))
            _arena_registered = True
    options.add_session_config_entry("session.use_env_allocators", "1")


def serving_session(
    model: Path | bytes,
    built: BuildRecord,
    *,
    intra_op_threads: int,
    allow_spinning: bool = False,
    data: Mapping[str, bytes] | None = None,
    arena: bool = True,
) -> tuple[Any, SessionPlan]:
    """A session for a bundle variant, tuned for serving: `intra_op_threads` each (a server runs
    several calls at once instead) and, by default, no spin-waiting, which would steal the cores
    the HTTP layer needs. A session that runs a batch alone on every core spins: without it, its
    threads sleep between operators and two threads were slower than one (int8 MiniLM, b1 x ~19
    tokens, AMD EPYC: 1 thread 3.55 ms, 2 threads 3.90 ms without spinning, 2.90 ms with it)."""
    plan = plan_for(built)
    session = create_session(
        model,
        plan,
        intra_op_threads=intra_op_threads,
        allow_spinning=allow_spinning,
        shared_arena=arena,
        arena=arena,
        data=data,
    )
    return session, plan
