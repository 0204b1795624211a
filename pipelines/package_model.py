"""The `package_model` Kubeflow pipeline: resolve the source, export, then per variant optimize ->
validate -> benchmark, then package what passed, fail the run if nothing did, and optionally
publish the bundle.

Targets shape the graph (each target's steps run on its own hardware and image: the cuda branch
runs on the GPU component image, its validate and benchmark steps on a GPU; on the cpu target,
resolve and export run on the component image, which carries PyTorch, and every other step on the
torch-free steps image, Dockerfile.steps, a tenth of its size), so a pipeline is built
for a set of targets by `make_pipeline`, together with the other graph options (images, a model
volume, the GPU timeout); everything else is a run-time parameter. One `dsl.ParallelFor` per
target runs its precisions side by side, and `dsl.Collected` hands every branch's outputs to the
package step.

Backend compatibility (README, "The Kubeflow pipeline"): the loops have no display names (a
`ParallelFor(name=...)` breaks the producer lookup on backends up to 2.15, kubeflow/pipelines
#13239), secrets are mounted as optional volumes (an optional secret as environment variables is
honoured only from backend 2.15), `dsl.Collected` of artifacts needs backend 2.14.

A variant that misses its gate does not stop the others: validate returns its verdict instead of
failing (kfp.local cannot collect over a failed or skipped loop iteration), benchmark skips a
missed variant, package writes the verdict without failing (a failed step's outputs are lost on
the backend), and the gate step then fails the run when no variant passed (or, with
`require_compatible`, when the new bundle is no drop-in for `baseline_bundle`). Only `kfp` is imported
here (and no `from __future__ import annotations`: KFP reads the pipeline signature's types).
"""

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl.pipeline_channel import PipelineChannel

from ortpack.components.benchmark import benchmark_variant
from ortpack.components.container_images import (
    COMPONENT_IMAGE,
    GPU_COMPONENT_IMAGE,
    GPU_ORT_VERSION,
    ORT_VERSION,
    STEPS_IMAGE,
    steps_image_for,
)
from ortpack.components.export import export_model
from ortpack.components.optimize import optimize_variant
from ortpack.components.package import check_gate, package_bundle, publish_bundle
from ortpack.components.source import resolve_source
from ortpack.components.validate import validate_variant
from ortpack.kernel.contracts import DEFAULT_TASK
from ortpack.kernel.targets import TARGETS
from ortpack.pipelines.defaults import COMPATIBILITY_BUDGET, GPU_TIMEOUT_S, MODEL_MOUNT

PIPELINE_NAME = "package-model"
ALL_TARGETS = tuple(TARGETS)  # kernel/targets.py: cpu, cuda
DEFAULT_TARGETS = ("cpu",)  # cuda is off by default: the committed YAML has no GPU branch
DEFAULT_PRECISIONS = {name: list(t.default_precisions) for name, t in TARGETS.items()}
GPU_RESOURCE = "nvidia.com/gpu"
# The secrets (run-time parameters name them) are mounted as optional volumes: a pod starts
# without them. One file per key; components/core/sources.py `load_credentials` reads them.
CREDENTIALS_SECRET = "ortpack-credentials"
CREDENTIALS_DIR = "/var/run/secrets/ortpack/credentials"  # = ortpack.components.core.sources.CREDENTIALS_DIR
SIGNING_SECRET = "ortpack-signing-key"
SIGNING_DIR = "/var/run/secrets/ortpack/signing"
SIGNING_KEY = f"{SIGNING_DIR}/key.pem"
# (cpu, memory) requests = limits per step, run-time parameters `<step>_cpu` / `<step>_memory`
RESOURCES = {
    "export": ("2", "8Gi"),
    "optimize": ("2", "8Gi"),
    "validate": ("2", "4Gi"),
    "benchmark": ("2", "4Gi"),
    "package": ("1", "4Gi"),
}
SMALL_STEP = ("500m", "1Gi")  # resolve, gate
PUBLISH_STEP = ("1", "2Gi")
# Retries are for transient faults only: the steps that talk to a store (resolve, publish). Export
# and optimize are deterministic given their inputs, so a refusal there (a degenerate reference, a
# bad path, a wrong option) would only come back after the back-off: they run once, and the
# export's downloads retry inside the step (components/core/build.py FETCH_ATTEMPTS).
RETRIES, RETRY_BACKOFF = 2, "60s"


def _resources(task: dsl.PipelineTask, cpu: Any, memory: Any) -> dsl.PipelineTask:
    """Requests equal to limits: predictable memory (no OOM surprises) and Guaranteed QoS, so the
    benchmarks measure steady cores."""
    task.set_cpu_request(cpu).set_cpu_limit(cpu).set_memory_request(memory).set_memory_limit(memory)
    # kfp 2.17.3 does not register resource parameters as the task's inputs, so a loop's sub-DAG
    # would not receive them ("input argument 'pipelinechannel--optimize_cpu' not found")
    task.register_pipeline_channels([v for v in (cpu, memory) if isinstance(v, PipelineChannel)])
    return task


def _on_gpu(task: dsl.PipelineTask, accelerator: Any, node_selector: Any, timeout_s: int) -> None:
    """Run a task on a GPU: one accelerator of the given type, the node selector (empty by
    default: no label that only GPU Feature Discovery sets), the GPU taint tolerated, a deadline."""
    task.set_accelerator_type(accelerator).set_accelerator_limit(1)
    task.register_pipeline_channels([v for v in (accelerator, node_selector) if isinstance(v, PipelineChannel)])
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration(task, key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")
    kubernetes.set_timeout(task, timeout_s)


def _with_secret(task: dsl.PipelineTask, secret: Any, mount_path: str) -> dsl.PipelineTask:
    return kubernetes.use_secret_as_volume(task, secret_name=secret, mount_path=mount_path, optional=True)


@dataclass(frozen=True, kw_only=True)
class _Graph:
    """How one compiled graph places its steps: images, the model volume, GPU deadline, caching
    and the per-target parallelism. Its methods add the pipeline's stages, in order: the source
    (resolve, export), each target's variant branches, then package, gate and publish."""

    cpu_image: str  # resolve and export: PyTorch
    steps_image: str  # the cpu target's optimize, validate and benchmark; package, gate and publish
    cuda_image: str
    model_pvc: str | None
    gpu_timeout_s: int
    cache: bool
    parallelism: int

    def cached(self, task: dsl.PipelineTask, enabled: bool = True) -> dsl.PipelineTask:
        return task.set_caching_options(enabled and self.cache)

    def source(self, p: dict[str, Any]) -> Any:
        """resolve -> export: what the model is now, and its ONNX export with the reference."""
        resolved = resolve_source(model_uri=p["model_uri"], task=p["task"], task_options=p["task_options"])
        self.cached(resolved.set_display_name("resolve source"), False)
        exported = export_model(
            model_uri=p["model_uri"],
            source_versions=resolved.output,
            task=p["task"],
            name=p["name"],
            task_options=p["task_options"],
            allow_degenerate_reference=p["allow_degenerate_reference"],
        )
        self.cached(exported.set_display_name("export"))
        _resources(exported, p["export_cpu"], p["export_memory"])
        for reader in (resolved, exported):
            reader.set_container_image(self.cpu_image)
            _with_secret(reader, p["credentials_secret"], CREDENTIALS_DIR)
            if self.model_pvc:
                kubernetes.mount_pvc(reader, pvc_name=self.model_pvc, mount_path=MODEL_MOUNT)
        _resources(resolved, *SMALL_STEP).set_retry(RETRIES, backoff_duration=RETRY_BACKOFF)
        return exported.outputs["exported"]

    def variants(self, p: dict[str, Any], exported: Any, targets: Sequence[str]) -> dict[str, Any]:
        """One branch per precision of each target, in parallel; the package step's inputs."""
        measured = {}
        for target in targets:
            with dsl.ParallelFor(p[f"{target}_precisions"], parallelism=self.parallelism) as precision:
                branch = self.variant_branch(target, precision, exported, p)
            measured[f"{target}_variants"] = dsl.Collected(branch)
        return measured

    def variant_branch(self, target: str, precision: Any, exported: Any, p: dict[str, Any]) -> Any:
        """optimize -> validate -> benchmark for one variant; returns the measured-variant output."""
        ort = GPU_ORT_VERSION if target == "cuda" else ORT_VERSION
        optimized = optimize_variant(
            exported=exported,
            target=target,
            precision=precision,
            ort_version=ort,
            int8_recipe=p["int8_recipe"],
            thresholds=p["thresholds"],
        )
        variant = optimized.outputs["variant"]
        validated = validate_variant(
            exported=exported,
            variant=variant,
            thresholds=p["thresholds"],
            ort_version=ort,
            allow_off_target_validation=p["allow_off_target_validation"],
        )
        measured = benchmark_variant(
            exported=exported, variant=variant, report=validated.outputs["report"], ort_version=ort
        )
        self.cached(measured, False)  # a benchmark measures this run's hardware, never a cache
        self.cached(optimized)
        self.cached(validated)
        for task, step in ((optimized, "optimize"), (validated, "validate"), (measured, "benchmark")):
            task.set_display_name(f"{step} {target}")
            task.set_container_image(self.cuda_image if target == "cuda" else self.steps_image)
            _resources(task, p[f"{step}_cpu"], p[f"{step}_memory"])
            if target == "cuda" and step != "optimize":  # building fp16 needs no GPU; running it does
                _on_gpu(task, p["gpu_accelerator"], p["gpu_node_selector"], self.gpu_timeout_s)
        return measured.outputs["measured"]

    def package(self, p: dict[str, Any], exported: Any, measured: dict[str, Any]) -> None:
        """package (the bundle, or a verdict with nothing shipped) -> gate -> publish (if asked)."""
        packaged = package_bundle(
            exported=exported,
            version=p["version"],
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            sign_key=p["sign_key"],
            baseline_bundle=p["baseline_bundle"],
            require_compatible=p["require_compatible"],
            compatibility_budget=p["compatibility_budget"],
            **measured,
        )
        self.cached(packaged.set_display_name("package"), False).set_container_image(self.steps_image)
        _resources(packaged, p["package_cpu"], p["package_memory"])
        _with_secret(packaged, p["signing_secret"], SIGNING_DIR)
        _with_secret(packaged, p["credentials_secret"], CREDENTIALS_DIR)  # to fetch the baseline bundle
        gate = check_gate(verdict=packaged.outputs["verdict"])
        self.cached(gate.set_display_name("gate")).set_container_image(self.steps_image)
        _resources(gate, *SMALL_STEP)
        with dsl.If(p["publish_to"] != ""):
            published = publish_bundle(bundle=packaged.outputs["bundle"], publish_to=p["publish_to"]).after(gate)
            self.cached(published.set_display_name("publish"), False).set_container_image(self.steps_image)
            published.set_retry(RETRIES, backoff_duration=RETRY_BACKOFF)
            _resources(published, *PUBLISH_STEP)
            _with_secret(published, p["credentials_secret"], CREDENTIALS_DIR)


def make_pipeline(
    targets: Sequence[str] = DEFAULT_TARGETS,
    parallelism: int = 0,
    *,
    image: str | None = None,
    gpu_image: str | None = None,
    steps_image: str | None = None,
    model_pvc: str | None = None,
    gpu_timeout_s: int = GPU_TIMEOUT_S,
    cache: bool = True,
) -> Callable[..., Any]:
    """The `package_model` pipeline for `targets` (a subset of cpu, cuda, in that order).

    `parallelism` caps how many variants of one target run at once (0: no cap; local runs use 1 so
    that benchmarks do not share this machine's cores). `image` / `gpu_image` replace the component
    images (tag or digest); `steps_image` the torch-free steps' (default: `steps_image_for(image)`
    when `image` is given, else STEPS_IMAGE); `model_pvc` mounts that PersistentVolumeClaim at /mnt/models in the
    steps that read the model; `cache=False` turns caching off for every step (`--no-cache`: a
    run of an uploaded pipeline version cannot override its compiled caching options).
    """
    targets = [t for t in ALL_TARGETS if t in targets]
    if not targets:
        raise ValueError(f"no known target in {list(targets)} (known: {', '.join(ALL_TARGETS)})")
    has_cpu, has_cuda = "cpu" in targets, "cuda" in targets
    graph = _Graph(
        cpu_image=image or COMPONENT_IMAGE,
        steps_image=steps_image or (steps_image_for(image) if image else STEPS_IMAGE),
        cuda_image=gpu_image or GPU_COMPONENT_IMAGE,
        model_pvc=model_pvc,
        gpu_timeout_s=gpu_timeout_s,
        cache=cache,
        parallelism=parallelism,
    )

    def package_model(
        model_uri: str = "all-MiniLM-L6-v2",
        task: str = DEFAULT_TASK,
        name: str = "",
        task_options: dict = {},  # noqa: B006 - KFP reads defaults from the signature
        cpu_precisions: list = DEFAULT_PRECISIONS["cpu"] if has_cpu else [],
        cuda_precisions: list = DEFAULT_PRECISIONS["cuda"] if has_cuda else [],
        thresholds: dict = {},  # noqa: B006 - KFP reads defaults from the signature
        int8_recipe: str = "",
        version: str = "",
        allow_degenerate_reference: bool = False,
        allow_off_target_validation: bool = False,
        sign_key: str = "",
        publish_to: str = "",
        baseline_bundle: str = "",
        require_compatible: bool = False,
        compatibility_budget: float = COMPATIBILITY_BUDGET,
        credentials_secret: str = CREDENTIALS_SECRET,
        signing_secret: str = SIGNING_SECRET,
        export_cpu: str = RESOURCES["export"][0],
        export_memory: str = RESOURCES["export"][1],
        optimize_cpu: str = RESOURCES["optimize"][0],
        optimize_memory: str = RESOURCES["optimize"][1],
        validate_cpu: str = RESOURCES["validate"][0],
        validate_memory: str = RESOURCES["validate"][1],
        benchmark_cpu: str = RESOURCES["benchmark"][0],
        benchmark_memory: str = RESOURCES["benchmark"][1],
        package_cpu: str = RESOURCES["package"][0],
        package_memory: str = RESOURCES["package"][1],
        gpu_accelerator: str = GPU_RESOURCE,
        gpu_node_selector: dict = {},  # noqa: B006 - KFP reads defaults from the signature
    ) -> None:
        """Package a PyTorch model into a verified, hardware-optimized ONNX Runtime bundle.

        Args:
            model_uri: s3://BUCKET/PREFIX/, minio://..., gs://..., https://.../CKPT.tar,
                hf://ORG/NAME@REVISION, a path in the image or under /mnt/models (--model-pvc),
                or a bundled model name (all-MiniLM-L6-v2); image models also a torchvision name,
                PACKAGE.MODULE:FACTORY (importable in the image) or a torch.export FILE.pt2.
            task: The task, e.g. text-embedding or image-classification (each is kernel/contracts/<task>.py).
            name: Bundle name (empty: the model's own).
            task_options: The task's options, {} for its defaults (each task's are its contract's,
                kernel/contracts/<task>.py). Text tasks: max_length (the model's own when not
                given). Image models: weights (a state-dict file, path or URI of a .safetensors
                file; default random), labels (a file, path or URI; default the weights'
                categories), resize_size, crop_size, mean, std, and validation_images /
                calibration_images (directories of photos, as the step sees them).
            cpu_precisions: Precisions to build for the cpu target (fp32, int8; int4 for text-generation).
            cuda_precisions: Precisions to build for the cuda target (fp16, fp32).
            thresholds: Parity threshold overrides, {precision or "*": {name: value}}.
            int8_recipe: Build the int8 variants with this recipe instead of the task's search
                (text: per-channel, per-tensor, ffn-out-fp32, each also +int8-embeddings; images:
                s8, s7, s8-uncorrected, s7-uncorrected); empty: search.
            version: Bundle version (empty: unique per run, the UTC time and the run id).
            allow_degenerate_reference: Build even when the PyTorch outputs barely vary (random
                weights; parity is then vacuous and the report says so).
            allow_off_target_validation: Ship variants checked on another execution provider
                than their target's (cuda variants where the image has no CUDA provider).
            sign_key: Private key (PEM) the package step signs the bundle with, as the step sees
                it (/var/run/secrets/ortpack/signing/key.pem from the signing secret); empty: unsigned.
            publish_to: After the gate passed, push to oci://HOST/REPO[:TAG] or upload a tar to
                s3://BUCKET/PREFIX/ (or minio://); empty: no publish step.
            baseline_bundle: Text-embedding models: the bundle an index was built with (any URI
                the server accepts, oci://, s3://, https://..., or a path as the package step sees
                it); the new bundle is compared with it as `ortpack bundle diff` does, and the
                verdict (drop-in, re-index, incompatible) goes into the report, verdict and metrics.
            require_compatible: Ship nothing and fail the run unless the new bundle is a drop-in
                for baseline_bundle (without it the verdict is only recorded).
            compatibility_budget: The cross-space recall ratio a drop-in must reach (0 to 1].
            credentials_secret: Kubernetes secret (optional) mounted for the steps that read the
                model, fetch the baseline bundle or publish: AWS_ACCESS_KEY_ID,
                AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, HF_TOKEN, gcs.json,
                ORTPACK_REGISTRY_USERNAME/PASSWORD.
            signing_secret: Kubernetes secret (optional) with key.pem (and password) for sign_key.
            export_cpu: CPU request and limit of the export step.
            export_memory: Memory request and limit of the export step.
            optimize_cpu: CPU request and limit of each optimize step.
            optimize_memory: Memory request and limit of each optimize step.
            validate_cpu: CPU request and limit of each validate step.
            validate_memory: Memory request and limit of each validate step.
            benchmark_cpu: CPU request and limit of each benchmark step (whole cores measure best).
            benchmark_memory: Memory request and limit of each benchmark step.
            package_cpu: CPU request and limit of the package step.
            package_memory: Memory request and limit of the package step.
            gpu_accelerator: Resource name of the GPU the cuda validate/benchmark steps ask for.
            gpu_node_selector: Node labels for the GPU steps, e.g. {"nvidia.com/gpu.present": "true"}
                where GPU Feature Discovery runs (empty: none).
        """
        p = dict(locals())
        exported = graph.source(p)
        graph.package(p, exported, graph.variants(p, exported, targets))

    entry = _without_parameters(package_model, set() if has_cuda else set(GPU_PARAMETERS))
    entry.__name__ = PIPELINE_NAME.replace("-", "_")
    return dsl.pipeline(name=PIPELINE_NAME, description="Export, optimize, validate, benchmark and package a model.")(
        entry
    )


GPU_PARAMETERS = ("cuda_precisions", "gpu_accelerator", "gpu_node_selector")


def _without_parameters(func: Callable[..., Any], drop: set[str]) -> Callable[..., Any]:
    """`func` with the parameters in `drop` removed from its signature (their defaults are used):
    a pipeline without a cuda branch has no GPU parameters. KFP calls the function positionally."""
    signature = inspect.signature(func)
    kept = [p for p in signature.parameters.values() if p.name not in drop]
    fixed = {p.name: p.default for p in signature.parameters.values() if p.name in drop}

    def entry(*args: Any) -> Any:
        return func(**dict(zip((p.name for p in kept), args, strict=True)), **fixed)

    entry.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    entry.__doc__ = func.__doc__
    return entry
