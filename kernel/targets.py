"""The hardware targets, each fact once: what the build makes for a target (its execution
providers, precisions, offline optimization, fusions), what the pipeline builds by default, and
how the server picks among a bundle's variants (`--variant auto`: the targets in `TRY_ORDER`, each
target's precisions in `preference` order when no benchmark from this kind of CPU ranks them).

Read by the build (`ortpack.components.core.specs` re-exports `Target` and `TARGETS`, and its
`get_target` raises the components' InvalidSpecError), the pipeline, the report and the server
(kernel/selection.py). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# int4 is weight-only (MatMulNBits), for the tasks whose family quantizes to it (decoders)
PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "int8", "int4")


@dataclass(frozen=True, kw_only=True)
class Target:
    """A named hardware preset. An optimized graph is specific to the hardware it was built for."""

    name: str
    # the first is the target's own: a server uses the target only where onnxruntime has it
    execution_providers: tuple[str, ...]
    precisions: tuple[str, ...]
    # `--variant auto` without benchmark numbers from this kind of CPU: best first (fp32 last: the
    # most faithful, the fallback when a variant misses here)
    preference: tuple[str, ...]
    default_precisions: tuple[str, ...]  # what the pipeline builds unless told otherwise
    # ORT graph optimization level applied offline before shipping. "extended" is safe across
    # CPUs of one architecture; "all" would bake in CPU-specific layouts, so we never ship it.
    offline_optimization_level: Literal["disabled", "basic", "extended"]
    use_gpu_fusions: bool
    description: str

    @property
    def provider(self) -> str:
        """The execution provider this target needs on the machine that runs it."""
        return self.execution_providers[0]


TARGETS: dict[str, Target] = {
    "cpu": Target(
        name="cpu",
        execution_providers=("CPUExecutionProvider",),
        precisions=("fp32", "int8", "int4"),
        preference=("int4", "int8", "fp32"),
        default_precisions=("fp32", "int8"),
        offline_optimization_level="extended",
        use_gpu_fusions=False,
        description="x86-64/ARM64 CPUs with ONNX Runtime's CPU execution provider",
    ),
    "cuda": Target(
        name="cuda",
        execution_providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
        precisions=("fp16", "fp32"),
        preference=("fp16", "fp32"),
        default_precisions=("fp16",),
        # A CUDA session cannot be created without a GPU, so ORT-level offline optimization is
        # left to the server (online); the transformer fusions are applied offline.
        offline_optimization_level="disabled",
        use_gpu_fusions=True,
        description="NVIDIA GPUs with ONNX Runtime's CUDA execution provider",
    ),
}

# The order `--variant auto` tries the targets in: the first whose provider this onnxruntime has.
TRY_ORDER: tuple[str, ...] = ("cuda", "cpu")
