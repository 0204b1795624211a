"""The `package_model` Kubeflow pipeline: export, then per variant optimize -> validate ->
benchmark, then package what passed.

Targets shape the graph (each target's steps run on its own hardware: cuda steps ask for a GPU),
so a pipeline is built for a set of targets by `make_pipeline`; precisions, thresholds and the
model are run-time parameters. One `dsl.ParallelFor` per target runs its precisions side by
side, and `dsl.Collected` hands every branch's outputs to the package step.

A variant that misses its gate does not stop the others: validate returns its verdict instead of
failing (kfp.local cannot collect over a failed or skipped loop iteration), benchmark skips a
missed variant, and package fails the run when no variant passed. Only `kfp` is imported here
(and no `from __future__ import annotations`: KFP reads the pipeline signature's types).
"""

from collections.abc import Callable, Sequence
from typing import Any

from kfp import dsl, kubernetes

from components.benchmark import benchmark_variant
from components.export import export_model
from components.images import ORT_VERSION
from components.optimize import optimize_variant
from components.package import package_bundle
from components.validate import validate_variant

PIPELINE_NAME = "package-model"
ALL_TARGETS = ("cpu", "cuda")
DEFAULT_PRECISIONS = {"cpu": ["fp32", "int8"], "cuda": ["fp16"]}
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")


def _on_gpu(task: dsl.PipelineTask) -> None:
    """Schedule a task on a GPU node: one GPU, the GPU node selector and toleration."""
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(1)
    kubernetes.add_node_selector(task, label_key=GPU_NODE_LABEL[0], label_value=GPU_NODE_LABEL[1])
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")


def _variant_branch(target: str, precision: Any, exported: Any, thresholds: Any, allow_off_target: Any) -> Any:
    """optimize -> validate -> benchmark for one variant; returns the measured-variant output."""
    optimized = optimize_variant(exported=exported, target=target, precision=precision, ort_version=ORT_VERSION)
    variant = optimized.outputs["variant"]
    validated = validate_variant(
        exported=exported,
        variant=variant,
        thresholds=thresholds,
        ort_version=ORT_VERSION,
        allow_off_target_validation=allow_off_target,
    )
    measured = benchmark_variant(
        exported=exported, variant=variant, report=validated.outputs["report"], ort_version=ORT_VERSION
    )
    for task, label in ((optimized, "optimize"), (validated, "validate"), (measured, "benchmark")):
        task.set_display_name(f"{label} {target}")
        if target == "cuda" and label != "optimize":  # building fp16 needs no GPU; running it does
            _on_gpu(task)
    return measured.outputs["measured"]


def make_pipeline(targets: Sequence[str] = ALL_TARGETS, parallelism: int = 0) -> Callable[..., Any]:
    """The `package_model` pipeline for `targets` (a subset of cpu, cuda, in that order).

    `parallelism` caps how many variants of one target run at once (0: no cap). Local runs use 1:
    the benchmark steps would otherwise share this machine's cores and measure each other.
    """
    targets = [t for t in ALL_TARGETS if t in targets]
    if not targets:
        raise ValueError(f"no known target in {list(targets)} (known: {', '.join(ALL_TARGETS)})")
    has_cpu, has_cuda = "cpu" in targets, "cuda" in targets

    def package_model(
        model: str = "all-MiniLM-L6-v2",
        task: str = "text-embedding",
        name: str = "",
        max_length: int = 0,
        weights: str = "",
        labels: str = "",
        preprocessing: dict = {},  # noqa: B006 - KFP reads defaults from the signature
        cpu_precisions: list = DEFAULT_PRECISIONS["cpu"] if has_cpu else [],
        cuda_precisions: list = DEFAULT_PRECISIONS["cuda"] if has_cuda else [],
        thresholds: dict = {},  # noqa: B006 - KFP reads defaults from the signature
        version: str = "1",
        allow_degenerate_reference: bool = False,
        allow_off_target_validation: bool = False,
    ) -> None:
        """Package a PyTorch model into a verified, hardware-optimized ONNX Runtime bundle.

        Args:
            model: A checkpoint directory or a bundled model name.
            task: text-embedding or image-classification.
            name: Bundle name (empty: the model's own).
            max_length: Token limit of text models (0: the model's own).
            weights: Image models: a state-dict file the component image can read (empty: random).
            labels: Image models: a labels file (empty: the weights' categories).
            preprocessing: Image models: overrides of resize_size, crop_size, mean, std.
            cpu_precisions: Precisions to build for the cpu target (fp32, int8).
            cuda_precisions: Precisions to build for the cuda target (fp16, fp32).
            thresholds: Parity threshold overrides, {precision or "*": {name: value}}.
            version: Bundle version.
            allow_degenerate_reference: Build even when the PyTorch outputs barely vary (random
                weights; parity is then vacuous and the report says so).
            allow_off_target_validation: Ship variants checked on another execution provider
                than their target's (cuda variants where the image has no CUDA provider).
        """
        exported = export_model(
            model=model,
            task=task,
            name=name,
            max_length=max_length,
            weights=weights,
            labels=labels,
            preprocessing=preprocessing,
            allow_degenerate_reference=allow_degenerate_reference,
        )
        exported.set_display_name("export")
        measured = {}
        if has_cpu:
            with dsl.ParallelFor(cpu_precisions, name="cpu-variants", parallelism=parallelism) as precision:
                cpu = _variant_branch(
                    "cpu", precision, exported.outputs["exported"], thresholds, allow_off_target_validation
                )
            measured["cpu_variants"] = dsl.Collected(cpu)
        if has_cuda:
            with dsl.ParallelFor(cuda_precisions, name="cuda-variants", parallelism=parallelism) as precision:
                cuda = _variant_branch(
                    "cuda", precision, exported.outputs["exported"], thresholds, allow_off_target_validation
                )
            measured["cuda_variants"] = dsl.Collected(cuda)
        package_bundle(exported=exported.outputs["exported"], version=version, **measured).set_display_name("package")

    package_model.__name__ = PIPELINE_NAME.replace("-", "_")
    return dsl.pipeline(name=PIPELINE_NAME, description="Export, optimize, validate, benchmark and package a model.")(
        package_model
    )
